"""The last telemetry each node's agent sent with its heartbeat (GPU temperatures and XIDs,
InfiniBand port states and error counters; `tensoryard.agent.telemetry` builds it), for the
console's Nodes page.

Kept in this control plane's memory, not in the store: it is replaced every few seconds and
means nothing after a restart. With several replicas each knows what the heartbeats it received
said (the agents' Service picks one per request, so each soon has a recent one).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError

__all__ = ["GpuTelemetry", "HeartbeatIn", "IbPortTelemetry", "NodeTelemetry", "TelemetryBook"]

log = logging.getLogger("tensoryard.server")

_KEY = r"^[A-Za-z0-9_.:-]{1,64}$"


class GpuTelemetry(BaseModel):
    gpu: int = Field(ge=0, le=1023, description="NVML index")
    temp_c: float | None = Field(None, ge=-50, le=200)
    memory_temp_c: float | None = Field(None, ge=-50, le=200)
    util_pct: float | None = Field(None, ge=0, le=100)
    job: str | None = Field(None, pattern=r"^[0-9]{1,12}$", description="the job holding it")
    rank: str | None = Field(None, pattern=r"^[0-9]{0,9}$", description="its rank ('' unknown)")
    xids: dict[str, int] = Field(
        default_factory=dict,
        max_length=64,
        description="XID -> events NVML reported since the agent started (only seen ones)",
    )


class IbPortTelemetry(BaseModel):
    device: str = Field(pattern=_KEY)
    port: str = Field(pattern=_KEY)
    state: str | None = Field(None, max_length=32, description="ACTIVE, DOWN, INIT, ...")
    physical_state: str | None = Field(None, max_length=32, description="LinkUp, Polling, ...")
    rate_gbps: float | None = Field(None, ge=0, le=100_000)
    errors: dict[str, int] = Field(
        default_factory=dict, max_length=32, description="error counter -> count since boot"
    )


class NodeTelemetry(BaseModel):
    gpus: list[GpuTelemetry] = Field(default_factory=list, max_length=256)
    ib_ports: list[IbPortTelemetry] = Field(default_factory=list, max_length=256)


class HeartbeatIn(BaseModel):
    telemetry: dict[str, Any] | None = Field(
        None,
        description="GPU and InfiniBand telemetry (NodeTelemetry); checked after the heartbeat "
        "is recorded, so a value out of range never costs the node its heartbeat",
    )


class NodeTelemetryOut(NodeTelemetry):
    node: str
    received_at: datetime


class TelemetryBook:
    """Node name -> its last telemetry (thread-safe: routes run in a thread pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, NodeTelemetryOut] = {}

    def put(self, node: str, raw: dict[str, Any], received_at: datetime) -> None:
        """Keep a node's telemetry; one that does not check out replaces the last with
        nothing (a warning names the field), so the page never shows stale numbers."""
        try:
            telemetry = NodeTelemetry.model_validate(raw)
        except ValidationError as exc:
            log.warning("node %s: telemetry ignored: %s", node, exc.errors()[0])
            with self._lock:
                self._last.pop(node, None)
            return
        entry = NodeTelemetryOut(node=node, received_at=received_at, **telemetry.model_dump())
        with self._lock:
            self._last[node] = entry

    def all(self, nodes: set[str]) -> list[NodeTelemetryOut]:
        """The last telemetry of these nodes (the ones the store knows), by name."""
        with self._lock:
            return [self._last[n] for n in sorted(self._last) if n in nodes]

    def job_gpus(self, job: int) -> list[tuple[str, GpuTelemetry]]:
        """(node, GPU) of every GPU the agents last said this job holds."""
        with self._lock:
            entries = list(self._last.values())
        return [(e.node, g) for e in entries for g in e.gpus if g.job == str(job)]
