"""The in-job runtime: imported inside training processes, never by the web framework.

    tensoryard.runtime
    ├── dist        init() from the torchrun environment, DistContext, shutdown()
    ├── checkpoint  Checkpointer: atomic saves, keep last k, exact resume (RNG included)
    ├── report      Reporter: step metrics, checkpoints, heartbeats -> control plane
    ├── goodput     compute_goodput (pure Python, used by the server too), GoodputTracker
    └── _session    session(): all of the above for a short training script

Names that need torch are imported lazily, so `import tensoryard.runtime.goodput` (what the
control plane does) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tensoryard.runtime.goodput import (
    GoodputEstimate,
    GoodputResult,
    GoodputTracker,
    StepTime,
    compute_goodput,
)
from tensoryard.runtime.report import Reporter, ReporterConfig

if TYPE_CHECKING:
    from tensoryard.runtime._session import Session, session
    from tensoryard.runtime.checkpoint import Checkpointer, CheckpointInfo
    from tensoryard.runtime.dist import DistContext, init, shutdown

__all__ = [
    "CheckpointInfo",
    "Checkpointer",
    "DistContext",
    "GoodputEstimate",
    "GoodputResult",
    "GoodputTracker",
    "Reporter",
    "ReporterConfig",
    "Session",
    "StepTime",
    "compute_goodput",
    "init",
    "session",
    "shutdown",
]

_LAZY = {
    "CheckpointInfo": "checkpoint",
    "Checkpointer": "checkpoint",
    "DistContext": "dist",
    "init": "dist",
    "shutdown": "dist",
    "Session": "_session",
    "session": "_session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensoryard.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tensoryard.runtime.{module}"), name)
