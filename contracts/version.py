"""The cptrace version, one place (``cptrace.__version__`` and the service read it here)."""

__version__ = "0.1.0"
