"""The one protocol every executor implements (local processes, Kubernetes, Slurm).

The reconciler drives executors only through this protocol. An executor knows nothing about
the database: it gets a LaunchRequest, returns a handle (plain JSON-able data that the control
plane stores with the attempt), and answers polls. After a control-plane restart the reconciler
hands the stored handle back to `reattach` to find the workload again.

Crash safety rests on two promises (see docs/state-machine.md):

- `prepare` computes the handle of an attempt without side effects, so the control plane can
  record it (with the attempt key) *before* anything starts;
- `launch` is idempotent per attempt key: called again for an attempt that already runs (or
  ran) it starts nothing new and returns the same workload's handle. A control plane that died
  anywhere in a launch simply calls `launch` again.

`terminate` finds every process/object of an attempt by its key and stops it at once; the
reconciler calls it before it declares an attempt LOST, so nothing runs that the store
believes gone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tensoryard.images.preflight import CONFIG_EXIT_CODE

if TYPE_CHECKING:  # keeps the shim's start-up free of pydantic
    from tensoryard.spec.job import JobSpec

__all__ = [
    "CONFIG_EXIT_CODE",
    "AttemptPhase",
    "AttemptStatus",
    "Executor",
    "LaunchRequest",
    "ReportsChanges",
]

# An attempt that ends with exit code CONFIG_EXIT_CODE (78, sysexits' EX_CONFIG) failed on its
# configuration (an image that does not match the matrix): it is not restarted, since the next
# attempt would meet the same configuration.


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to start one attempt of a job."""

    job_id: str
    attempt: int  # 1-based
    spec: JobSpec
    run_dir: Path  # per-job directory; the executor writes attempt logs under it
    env: dict[str, str] = field(default_factory=dict)  # TYARD_* contract vars, merged over spec.env
    placement: dict[str, list[int]] = field(default_factory=dict)  # node -> GPU indices
    attempt_key: str = ""  # names everything of this attempt; "" lets the executor make one
    # Worker restarts the launcher may do by itself (torchrun --max-restarts) before the attempt
    # fails; each restarted group reports as the next attempt number (0: none).
    in_place_restarts: int = 0
    # The leader epoch the control plane launched under (its fencing token): executors record
    # it with the workload (a Slurm job's comment, a pod annotation) so a duplicate is traceable.
    fencing_epoch: int = 0


class AttemptPhase(enum.StrEnum):
    STARTING = "starting"  # launched, workers not yet confirmed running
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped on our request
    LOST = "lost"  # the workload cannot be found any more (reattach failed, node gone)


@dataclass(frozen=True)
class AttemptStatus:
    phase: AttemptPhase
    exit_code: int | None = None
    reason: str = ""  # human-readable: "rank 1 exited with code 137 (killed by SIGKILL)"
    failed_ranks: tuple[int, ...] = ()
    # STARTING only: waiting in an admission queue outside tensoryard (Kueue); the starting
    # timeout counts from the end of that wait, not from the launch.
    queued: bool = False
    # When the external admission engine granted the attempt's resources (unix seconds; Kueue's
    # QuotaReserved time); the wait before it is queueing, not startup, in the goodput account.
    admitted_at: float | None = None
    # Nodes the executor saw lost under this attempt (deleted, NotReady, unreachable): the
    # control plane's next placement excludes them at once, not after a second failure.
    lost_nodes: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase not in (AttemptPhase.STARTING, AttemptPhase.RUNNING)


@runtime_checkable
class Executor(Protocol):
    """Starts, watches and stops attempts. Handles are JSON-able dicts."""

    name: str

    def prepare(self, request: LaunchRequest) -> dict[str, Any]:
        """The handle `launch` will return, computed without side effects (to record first)."""
        ...

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Start the attempt; return a handle to store. Raise ExecutorError on failure.

        Idempotent per `request.attempt_key`: when the attempt was launched before (fully or
        partly), nothing new starts and the existing workload's handle is returned."""
        ...

    def terminate(self, handle: dict[str, Any]) -> int:
        """Kill every process of the attempt (found by its key) now; how many were running."""
        ...

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        """Current status of the attempt behind `handle`. Never blocks for long."""
        ...

    def cancel(self, handle: dict[str, Any], *, grace_s: float) -> None:
        """Ask the workload to stop (SIGTERM-like), force it after `grace_s`. Idempotent;
        returns at once, the escalation happens in the background or on later polls."""
        ...

    def reattach(self, handle: dict[str, Any]) -> AttemptStatus:
        """After a control-plane restart: find the workload again and report its status
        (LOST when it cannot be found and left no exit record)."""
        ...

    def log_paths(self, handle: dict[str, Any]) -> dict[int, Path]:
        """Rank -> log file, for `tyard logs`."""
        ...


@runtime_checkable
class ReportsChanges(Protocol):
    """An executor that tells the control loop when an attempt may have changed (a process
    exited, a pod or JobSet was updated), so the loop wakes at once and reconciles only the
    jobs named, with a slow full pass as the safety net (docs/state-machine.md, "Events")."""

    def report_changes(self, changed: Callable[[int | None], None]) -> bool:
        """From now on call ``changed(job_id)`` (``None``: some job, which is unknown) from
        any thread when an attempt of that job may have changed; False when this executor
        cannot (then the loop keeps polling every attempt every cycle). Never blocks the
        caller for long; calls may repeat, arrive late or be lost (the full pass repairs
        that)."""
        ...
