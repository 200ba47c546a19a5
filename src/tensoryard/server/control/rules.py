"""What the phases of the control loop share: the words an attempt's reason starts with (they
steer its job's next state), the in-place restart budget, and the error for a stored job the
loop cannot act on. No state, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from tensoryard.errors import TensoryardError
from tensoryard.runtime.megatron import recognise
from tensoryard.server.scheduling import NodeCapacity
from tensoryard.spec.job import JobSpec
from tensoryard.store import AttemptRecord, JobRecord, NodeRecord, Store

__all__ = [
    "DRAINED",
    "HUNG",
    "LEADER_LEASE",
    "MAX_RUNTIME",
    "NOT_STARTED",
    "PREEMPTED",
    "SCHEDULER_STATE_KEY",
    "BadJobData",
    "CapacityProvider",
    "NodeSync",
    "current_attempt",
    "drained_node",
    "in_place_restarts",
    "is_drain",
    "utc",
]

PREEMPTED = "preempted"
MAX_RUNTIME = "exceeded max_runtime"
HUNG = "hung"
NOT_STARTED = "did not start"
DRAINED = " drained: "  # in "node n3 drained: XID 79 on GPU 2"
LEADER_LEASE = "controller"
SCHEDULER_STATE_KEY = "core"

CapacityProvider = Callable[[], tuple[NodeCapacity, ...]]
# Makes the executor's own node objects agree with the stored cordon states (Kubernetes:
# cordon the Node); called every cycle, must not raise, retries on its own next call.
NodeSync = Callable[[Mapping[str, NodeRecord]], object]


class BadJobData(TensoryardError):
    """A stored job that cannot be acted on (its spec or handle is invalid)."""


def in_place_restarts(spec: JobSpec, *, restarts: int) -> int:
    """How many times torchrun may restart a launch's workers itself, for a job that had
    `restarts` before it: restart.in_place, within what is left of max_restarts (each in-place
    restart counts). torchrun jobs; a multi-node gang restarts together through the c10d
    rendezvous (local executor: executors/local/gang.py; Kubernetes: runtime/gang.py)."""
    if spec.launcher != "torchrun":
        return 0
    if recognise(spec.command, spec.framework) is not None:
        return 0  # its progress is followed per launch (MegatronMonitor), not per restart
    return max(0, min(spec.restart.in_place, spec.restart.max_restarts - restarts))


def is_drain(reason: str) -> bool:
    return reason.startswith("node ") and DRAINED in reason


def drained_node(reason: str) -> str | None:
    """The node a drain stopped the attempt for ("node n1 drained: ..."), or None."""
    return reason.split()[1] if is_drain(reason) else None


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def current_attempt(store: Store, job: JobRecord) -> AttemptRecord | None:
    """The job's latest attempt (None before its first)."""
    if job.attempts == 0:
        return None
    return store.get_attempt(job.id, job.attempts)
