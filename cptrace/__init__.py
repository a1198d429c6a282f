"""cptrace: trace analysis and diagnostics for context-parallel attention on packed sequences."""

from contracts.version import __version__

__all__ = ["__version__"]
