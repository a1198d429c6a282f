"""cptrace: trace analysis and diagnostics for context-parallel attention on packed sequences."""

__version__ = "0.1.0"
