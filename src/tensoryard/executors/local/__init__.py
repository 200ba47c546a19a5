"""The local executor: each attempt is a supervised process tree on this machine.

Process tree of one attempt (every arrow starts a new session, so signals aimed at one part
never hit another by accident, and a control-plane SIGKILL does not reach the job)::

    control plane ──> shim (executors/local/shim.py, child subreaper)
                        └─> torchrun ──> rank.py (rank R) ──> python script   (one per rank)
                        └─> python script                    (launcher: python, rank 0)

Files in ``run_dir/attempt-N/`` (see ``layout``): ``launch.json`` (what to run, 0600),
``shim.json`` (pids and create times), ``cancel.json``, ``exit.json`` (written once, atomically,
after everything stopped), ``rank-R.log`` (live stdout+stderr of rank R), ``rank-R.exit.json``,
``launcher.log`` (shim and torchrun output).

Guarantees:

- The job outlives the control plane; ``reattach`` finds the shim by (pid, create time), so a
  reused pid is never taken for the shim.
- No orphans: the shim is a subreaper and kills leftovers when the workload ends; a cancel is
  SIGTERM to the workload's group, then SIGKILL to every process of the attempt after the
  grace period (done by the shim, so it happens even when the control plane is down); if the
  shim itself died, ``poll``/``reattach`` kill every process carrying the attempt's
  ``TYARD_ATTEMPT_KEY`` and report LOST.
- Exit codes become phases in ``outcome.attempt_status``; failed ranks come from the per-rank
  exit records, falling back to torchrun's own failure report.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensoryard.executors.local.executor import LocalExecutor, LocalHandle

__all__ = ["LocalExecutor", "LocalHandle"]


def __getattr__(name: str) -> Any:
    # Lazy, so the shim (python -m tensoryard.executors.local.shim) starts without pydantic.
    if name in __all__:
        return getattr(importlib.import_module("tensoryard.executors.local.executor"), name)
    raise AttributeError(name)
