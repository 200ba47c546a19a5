"""The node agent's service: `/metrics` for Prometheus and the health report that closes the loop.

One process per node (`tyard agent`). It serves every node collector from its own registry
(never the global one), labels GPU series with the job, team and rank holding each GPU (from the
control plane's placements), tails the NCCL logs of the jobs running here, and every few seconds
checks the node's health: a new fatal XID (NVML events), an InfiniBand port that left ACTIVE, a
health-check command that failed. A fault is posted to the control plane as a firing alert with
``health_action: drain_node`` (the same shape Alertmanager posts), and the control plane cordons
the node and requeues its jobs. A report that cannot be delivered is kept and sent again.

A scrape always answers: a collector that raises is counted in
``tyard_collector_errors_total{collector}`` and logged, and the rest of the scrape is served.
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from tensoryard.agent.telemetry import node_telemetry
from tensoryard.errors import TensoryardError
from tensoryard.observability.base import Collector, CollectorErrors
from tensoryard.observability.gpu import FATAL_XIDS, GpuCollector, GpuOwner
from tensoryard.observability.infiniband import InfinibandCollector
from tensoryard.observability.nccl import NcclLogCollector, NcclLogSource
from tensoryard.observability.ranks import RankStatsCollector, RankStatsSource, rank_processes
from tensoryard.observability.registry import agent_registry, render
from tensoryard.observability.storage import (
    DiskstatsCollector,
    MountsCollector,
    ProcessIoCollector,
)

__all__ = ["AgentConfig", "ControlPlaneApi", "NodeAgent", "gpu_owners"]

log = logging.getLogger("tensoryard.agent")

DEFAULT_AGENT_PORT = 9410
_IB_ACTIVE = "4: ACTIVE"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"  # what registry.render writes


@dataclass(kw_only=True)
class AgentConfig:
    """Settings of one node agent. Every field has a production default."""

    node: str = field(default_factory=socket.gethostname)
    """This node's name as the control plane knows it (`tyard nodes list`)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_AGENT_PORT

    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")

    jobs_interval_s: float = 10.0
    """How often the jobs running here (GPU owners, NCCL log dirs) are read from the control
    plane; scrapes use the last answer, so a slow control plane never slows a scrape."""

    health_interval_s: float = 5.0
    """How often the node's health is checked (and undelivered reports sent again)."""

    checks: tuple[str, ...] = ()
    """Health-check commands (run without a shell, split on spaces); a non-zero exit or a
    timeout drains the node."""

    check_timeout_s: float = 60.0


class ControlPlaneApi(Protocol):
    """What the agent asks of the control plane (tensoryard.client.Client satisfies it)."""

    def jobs(self, *, state: list[str] | None = None, limit: int = 50) -> dict[str, Any]: ...

    def report_health(self, alerts: list[dict[str, Any]]) -> dict[str, Any]: ...

    def node_heartbeat(
        self, name: str, telemetry: dict[str, Any] | None = None
    ) -> dict[str, Any]: ...


class _Guarded:
    """A collector whose failure becomes a counted error, never a failed scrape."""

    def __init__(self, name: str, inner: Collector, errors: CollectorErrors) -> None:
        self.name, self.inner, self.errors = name, inner, errors

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self.inner.collect())
        except Exception as exc:  # a bug or an unforeseen device state: serve the rest
            self.errors.record(self.name, "collect", exc)
            return []


def gpu_owners(jobs: Iterable[Mapping[str, Any]], node: str) -> dict[int, GpuOwner]:
    """GPU index -> the job, team and rank holding it on `node`, from the control plane's
    running jobs. The rank is known when each process has one GPU (processes_per_node equals
    gpus_per_node): local rank i drives the i-th GPU of the node's placement, and the node's
    rank is its position in the placement; otherwise the rank is left empty."""
    owners: dict[int, GpuOwner] = {}
    for job in jobs:
        placement: Mapping[str, Sequence[int]] = job.get("placement") or {}
        gpus = placement.get(node)
        if not gpus:
            continue
        resources = (job.get("spec") or {}).get("resources") or {}
        per_node = resources.get("processes_per_node")
        node_rank = list(placement).index(node)
        for local, index in enumerate(gpus):
            rank = str(node_rank * len(gpus) + local) if per_node == len(gpus) else ""
            owners[int(index)] = GpuOwner(str(job["id"]), str(job.get("team", "")), rank)
    return owners


class NodeAgent:
    """The collectors, their registry, the job view and the health loop of one node."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        control_plane: ControlPlaneApi | None = None,
        nvml: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.control_plane = control_plane
        self.clock = clock
        self.errors = CollectorErrors()
        self._owners: Mapping[int, GpuOwner] = {}
        self._nccl: tuple[NcclLogSource, ...] = ()
        self._ranks: tuple[RankStatsSource, ...] = ()
        self.gpu = GpuCollector(
            nvml,
            owners=lambda: self._owners,
            hostname=lambda: config.node,
            errors=self.errors,
        )
        self.infiniband = InfinibandCollector(config.sys_root, errors=self.errors)
        collectors: list[tuple[str, Collector]] = [
            ("infiniband", self.infiniband),
            ("diskstats", DiskstatsCollector(config.proc_root, errors=self.errors)),
            ("mounts", MountsCollector(config.proc_root, errors=self.errors)),
            ("gpu", self.gpu),
            ("nccl", NcclLogCollector(lambda: self._nccl, errors=self.errors)),
            ("ranks", RankStatsCollector(lambda: self._ranks, errors=self.errors)),
            (
                "process_io",
                ProcessIoCollector(
                    lambda: rank_processes(self._ranks, config.proc_root, errors=self.errors),
                    config.proc_root,
                    errors=self.errors,
                ),
            ),
        ]
        guarded: list[Collector] = [_Guarded(n, c, self.errors) for n, c in collectors]
        self.errors.declare("agent", *(n for n, _ in collectors))
        self.registry = agent_registry([*guarded, self.errors])
        self._reported_xids: dict[tuple[int, int], int] = {}
        self._ib_seen_active: set[str] = set()
        self._ib_down_reported: set[str] = set()
        self._failed_checks: set[str] = set()
        self._undelivered: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None

    # ---- /metrics ---------------------------------------------------------------------------

    def scrape(self) -> bytes:
        """The Prometheus text of every collector (never raises)."""
        try:
            return render(self.registry)
        except Exception as exc:
            self.errors.record("agent", "render", exc)
            return render(agent_registry([self.errors]))

    # ---- the jobs running here --------------------------------------------------------------

    def refresh_jobs(self) -> None:
        """Read the running jobs from the control plane: GPU owners, NCCL log and rank dirs."""
        if self.control_plane is None:
            return
        try:
            page = self.control_plane.jobs(state=["STARTING", "RUNNING"], limit=1000)
        except TensoryardError as exc:
            self.errors.record("agent", "reading running jobs from the control plane", exc)
            return
        here = [j for j in page.get("items", []) if self.config.node in (j.get("placement") or {})]
        self._owners = gpu_owners(here, self.config.node)
        with_dir = [j for j in here if j.get("run_dir")]
        self._nccl = tuple(
            NcclLogSource(Path(j["run_dir"]) / "nccl", str(j["id"]), str(j.get("team", "")))
            for j in with_dir
        )
        self._ranks = tuple(
            RankStatsSource(Path(j["run_dir"]) / "ranks", str(j["id"]), str(j.get("team", "")))
            for j in with_dir
        )

    # ---- health -----------------------------------------------------------------------------

    def check_health(self) -> list[dict[str, Any]]:
        """The faults found since the last check, as firing alerts (each reported once)."""
        alerts = self._new_xids() + self._ib_ports_down() + self._run_checks()
        return [{"state": "firing", "labels": a} for a in alerts]

    def telemetry(self) -> dict[str, Any]:
        """GPU temperatures and XIDs, InfiniBand port states and error counters, as the GPU
        and InfiniBand collectors read them now (:mod:`tensoryard.agent.telemetry`); a
        collector that fails is counted like in a scrape and its part left out."""
        families: list[Metric] = []
        for name, collector in (("gpu", self.gpu), ("infiniband", self.infiniband)):
            try:
                families += list(collector.collect())
            except Exception as exc:
                self.errors.record(name, "telemetry for the heartbeat", exc)
        return node_telemetry(families)

    def heartbeat(self) -> bool:
        """Tell the control plane this node's agent is alive (where the executor has no view of
        its own of the node, silence means the node is lost), with the node's telemetry for
        the console; False when it was not told."""
        if self.control_plane is None:
            return False
        try:
            self.control_plane.node_heartbeat(self.config.node, self.telemetry())
        except TensoryardError as exc:
            log.warning("heartbeat not delivered: %s", exc)
            self.errors.record("agent", "posting the heartbeat to the control plane", exc)
            return False
        return True

    def report(self) -> dict[str, Any] | None:
        """Check health and post new faults (and earlier undelivered ones), then the heartbeat;
        the answer of the control plane to the faults, or None when there was nothing to send
        or it could not be reached."""
        try:
            return self._report_faults()
        finally:
            self.heartbeat()

    def _report_faults(self) -> dict[str, Any] | None:
        self._undelivered += self.check_health()
        if not self._undelivered or self.control_plane is None:
            return None
        try:
            answer = self.control_plane.report_health(list(self._undelivered))
        except TensoryardError as exc:
            log.warning("health report not delivered (will retry): %s", exc)
            self.errors.record("agent", "posting health to the control plane", exc)
            return None
        for alert in self._undelivered:
            log.warning("reported %s", alert["labels"])
        self._undelivered = []
        return answer

    def _labels(self, name: str, **extra: str) -> dict[str, str]:
        return {
            "alertname": name,
            "health_action": "drain_node",
            "severity": "critical",
            "Hostname": self.config.node,
            "source": "tyard-agent",
            **extra,
        }

    def _new_xids(self) -> list[dict[str, str]]:
        out = []
        try:
            counts = self.gpu.xid_counts()
        except Exception as exc:  # NVML broke in a way the collector did not foresee
            self.errors.record("gpu", "reading XID events", exc)
            return []
        for (gpu, xid), count in sorted(counts.items()):
            if xid in FATAL_XIDS and count > self._reported_xids.get((gpu, xid), 0):
                self._reported_xids[(gpu, xid)] = count
                out.append(self._labels("GpuFatalXid", gpu=str(gpu), xid=str(xid)))
        return out

    def _ib_ports_down(self) -> list[dict[str, str]]:
        """Ports that were ACTIVE earlier in this agent's life and no longer are (a port never
        cabled is not a fault); reported once per outage."""
        out = []
        for state_file in sorted(self.config.sys_root.glob("class/infiniband/*/ports/*/state")):
            port_dir = state_file.parent
            key = f"{port_dir.parent.parent.name}/{port_dir.name}"
            try:
                state = state_file.read_text(encoding="ascii").strip()
            except (OSError, UnicodeError) as exc:
                self.errors.record("agent", str(state_file), exc)
                continue
            if state == _IB_ACTIVE:
                self._ib_seen_active.add(key)
                self._ib_down_reported.discard(key)
            elif key in self._ib_seen_active and key not in self._ib_down_reported:
                self._ib_down_reported.add(key)
                device, port = key.split("/")
                out.append(self._labels("InfinibandPortDown", device=device, port=port))
        return out

    def _run_checks(self) -> list[dict[str, str]]:
        out = []
        for command in self.config.checks:
            argv = command.split()
            try:
                done = subprocess.run(
                    argv, capture_output=True, timeout=self.config.check_timeout_s, check=False
                )
                ok = done.returncode == 0
                outcome = f"exit code {done.returncode}"
            except subprocess.TimeoutExpired:
                ok, outcome = False, f"no answer within {self.config.check_timeout_s:g}s"
            except OSError as exc:
                ok, outcome = False, f"cannot run it: {exc.strerror or exc}"
            if not ok:
                log.warning("health check %s failed: %s", command, outcome)
            if ok:
                self._failed_checks.discard(command)
            elif command not in self._failed_checks:
                self._failed_checks.add(command)
                # the whole command, in the words a drain reason can carry (no , ( or ))
                said = " ".join(re.sub(r"[,()]", " ", command).split())
                out.append(
                    self._labels(
                        "HealthCheckFailed", check=said, outcome=re.sub(r"[,()]", " ", outcome)
                    )
                )
        return out

    # ---- serving ----------------------------------------------------------------------------

    def start(self) -> str:
        """Serve /metrics and run the job and health loops in the background; returns the
        URL it listens on (port 0 picks a free port)."""
        self._http = ThreadingHTTPServer((self.config.host, self.config.port), _handler(self))
        self._http.daemon_threads = True
        loops = (
            ("tyard-agent-http", self._http.serve_forever),
            (
                "tyard-agent-jobs",
                lambda: self._every(self.config.jobs_interval_s, self.refresh_jobs),
            ),
            ("tyard-agent-health", lambda: self._every(self.config.health_interval_s, self.report)),
        )
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def _every(self, interval_s: float, action: Callable[[], object]) -> None:
        while not self._stop.is_set():
            try:
                action()
            except Exception:  # the loop must survive anything; the next round retries
                log.exception("agent loop step failed")
            self._stop.wait(interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self.gpu.close()


def _handler(agent: NodeAgent) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection

        def setup(self) -> None:
            super().setup()  # headers and body are two writes: no Nagle delay between them
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = agent.scrape() if self.path.startswith("/metrics") else _INDEX
            self.send_response(200)
            kind = TEXT_FORMAT if self.path.startswith("/metrics") else "text/plain"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


_INDEX = b"tensoryard node agent: Prometheus metrics at /metrics\n"
