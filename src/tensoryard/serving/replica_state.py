"""What the replica supervisor and its backends share: a replica, a deployment's supervised
state, the backend protocol, and the supervisor's side that backends call back into.

A backend runs the replicas of one kind of deployment: :mod:`tensoryard.serving.replicas_local`
as processes on this machine, :mod:`tensoryard.serving.replicas_kube` as pods on Kubernetes.
:class:`tensoryard.serving.replicas.ReplicaManager` picks one per deployment (by its engine) and
otherwise knows nothing of either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tensoryard.serving.autoscale import Autoscaler
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.router import Router
from tensoryard.store import Store
from tensoryard.store._serving import DeploymentRecord, ReplicaRecord

if TYPE_CHECKING:
    from tensoryard.serving.kubernetes import ServingPod

__all__ = [
    "CommandFor",
    "DeploymentState",
    "Replica",
    "ReplicaBackend",
    "Supervisor",
    "alive",
    "free_port",
    "terminate",
]

CommandFor = Callable[[DeploymentRecord, int], list[str]]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class Replica:
    """A replica process as the supervisor and the gateway see it."""

    deployment: str
    slot: int
    port: int
    pid: int | None
    popen: subprocess.Popen[bytes] | None = None
    ready: bool = False
    in_flight: int = 0
    pending_chars: int = 0  # uncached prompt characters of the requests in flight
    restarts: int = 0
    retry_at: float | None = None  # set when it exited: restart no earlier than this
    host: str = "127.0.0.1"
    pod: ServingPod | None = None  # when the replica is a pod on Kubernetes

    @property
    def id(self) -> str:
        return f"{self.deployment}/{self.pod.name if self.pod is not None else self.slot}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def exited(self) -> bool:
        if self.pod is not None:
            return False  # Kubernetes restarts and replaces pods
        if self.popen is not None:
            return self.popen.poll() is not None
        return self.pid is None or not alive(self.pid)


@dataclass
class DeploymentState:
    """One deployment as the supervisor keeps it between reconciles."""

    record: DeploymentRecord
    router: Router
    replicas: dict[int, Replica] = field(default_factory=dict)
    last_request: float = 0.0
    asleep: bool = False  # scaled to zero after idling
    waiting: int = 0
    retiring: dict[int, Replica] = field(default_factory=dict)  # serving the previous model
    drain_from: float | None = None  # when every new replica was first seen ready
    autoscaler: Autoscaler | None = None
    target: int | None = None  # replicas wanted at the last reconcile (None: not yet)
    pod_slots: dict[str, int] = field(default_factory=dict)  # Kubernetes: pod name -> slot
    polled_at: float = float("-inf")  # Kubernetes: when its pods were last listed
    error: str = ""  # Kubernetes: why the last apply or listing failed ("" when it did not)


class Supervisor(Protocol):
    """The supervisor's side a backend uses: storage, metrics, clock and the lock that guards
    every :class:`DeploymentState` (the gateway reads them from other threads)."""

    store: Store
    metrics: ServingMetrics
    log_dir: Path
    command_for: CommandFor
    clock: Callable[[], float]

    @property
    def lock(self) -> threading.Lock: ...

    def answers(self, port: int) -> bool: ...


class ReplicaBackend(Protocol):
    """Where a deployment's replicas run. The supervisor decides the target count (phases 1
    and 2 of :mod:`tensoryard.serving.replicas`); the backend makes the replicas match it."""

    def adopt(self, dep: DeploymentState) -> None:
        """A deployment first seen by this process: find its live replicas."""

    def roll(
        self,
        old: DeploymentState,
        new: DeploymentState,
        rows: dict[int, ReplicaRecord],
        leftover: list[Replica],
    ) -> None:
        """``new`` serves something else than ``old``: carry over what keeps serving, put the
        replicas to stop into ``leftover``."""

    def reconcile(self, dep: DeploymentState, target: int, now: float) -> None:
        """Make the deployment's replicas match ``target`` (phases 3 to 5)."""

    def forget(self, dep: DeploymentState) -> None:
        """The deployment was deleted: stop what runs for it."""

    def sweep(self, deployments: Iterable[str]) -> None:
        """Now and then: clean up after deployments deleted while nobody watched."""

    def shutdown(self, deps: Iterable[DeploymentState]) -> None:
        """The supervisor stops and takes its replicas down with it, where they cannot outlive
        it."""


def terminate(r: Replica, grace_s: float = 5.0) -> None:
    """SIGTERM the replica's process group, SIGKILL after the grace period."""
    if r.pid is None:
        return
    try:
        os.killpg(r.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if r.popen is not None:
            if r.popen.poll() is not None:
                return
        elif not alive(r.pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(r.pid, signal.SIGKILL)
    if r.popen is not None:
        r.popen.wait(timeout=5)
