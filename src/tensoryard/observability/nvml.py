"""Loading NVML: the one place that imports the bindings, for the GPU collector and the node
inventory alike (both import downward from here)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_nvml"]


def load_nvml() -> Any | None:
    """The real NVML bindings, or None when `nvidia-ml-py` is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None
