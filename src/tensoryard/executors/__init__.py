"""Executors: one protocol (`base.Executor`), several implementations (`local` today).

Names are loaded lazily so that the local shim, which imports this package, starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensoryard.executors.base import AttemptPhase, AttemptStatus, Executor, LaunchRequest

__all__ = ["AttemptPhase", "AttemptStatus", "Executor", "LaunchRequest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("tensoryard.executors.base"), name)
    raise AttributeError(name)
