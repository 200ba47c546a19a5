"""tensoryard: an LLM training platform for a shared GPU cluster."""

__version__ = "0.1.0"
__all__ = ["__version__"]
