"""Run every preflight check and build one report; optionally POST it somewhere.

The report is plain JSON: ``{"node", "ok", "checks": [{name, status, message, details}]}``.
``ok`` is False when any check failed. Warnings and skips do not fail a node.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from tensoryard.cluster.compat import GPU_MODELS
from tensoryard.cluster.inventory import Inventory
from tensoryard.cluster.preflight.allreduce import AllReduceResult, run_allreduce
from tensoryard.cluster.preflight.checks import (
    CheckResult,
    Expectations,
    TorchVersions,
    check_ecc,
    check_fabric_manager,
    check_gpus,
    check_infiniband,
    check_nvlink,
    check_topology,
    check_versions,
    torch_versions,
)
from tensoryard.cluster.preflight.runner import CommandRunner, SubprocessRunner
from tensoryard.errors import ConfigError, TensoryardError

__all__ = [
    "PreflightReport",
    "check_allreduce",
    "expectations_for",
    "post_report",
    "run_preflight",
]


@dataclass
class PreflightReport:
    """All check results of one node."""

    node: str
    checks: list[CheckResult] = field(default_factory=list)
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "time": self.time,
            "ok": self.ok,
            "checks": [c.as_dict() for c in self.checks],
        }


def expectations_for(inventory: Inventory, node: str) -> Expectations:
    """What the inventory says about `node`; ConfigError when it is not listed."""
    spec = next((n for n in inventory.nodes if n.name == node), None)
    if spec is None:
        names = ", ".join(n.name for n in inventory.nodes[:5])
        raise ConfigError(
            f"node {node!r} is not in the inventory (first nodes: {names}; "
            "fix: pass --node NAME as written in the inventory)"
        )
    return Expectations(
        gpu_model=spec.gpu.model,
        gpu_count=spec.gpu.count,
        interconnect=spec.gpu.interconnect,
        ib_hcas=tuple(spec.ib.hcas) if spec.ib else (),
        ib_rate_gbps=spec.ib.rate_gbps if spec.ib else None,
        software=inventory.stack,
    )


def check_allreduce(
    expect: Expectations,
    *,
    run: Callable[..., AllReduceResult] = run_allreduce,
    world_size: int = 2,
    size_bytes: int = 8 * 1024 * 1024,
) -> CheckResult:
    """A short all-reduce; on GPUs its bus bandwidth must reach the model's floor."""
    try:
        result = run(world_size=world_size, size_bytes=size_bytes)
    except Exception as exc:  # a crashed worker is a failed node, not a crashed preflight
        return CheckResult("allreduce", "fail", f"all-reduce did not complete: {exc}")
    details = result.as_dict()
    text = (
        f"{result.backend} x{result.world_size}, {result.size_bytes / 2**20:.0f} MiB: "
        f"busbw {result.busbw_gbps:.2f} GB/s"
    )
    if not result.correct:
        return CheckResult("allreduce", "fail", f"{text}; WRONG RESULT", details)
    if result.world_size == 1:  # NCCL ran and was right; one rank moves nothing over a bus
        return CheckResult("allreduce", "pass", f"{text} (one GPU: no bus to measure)", details)
    model = GPU_MODELS.get(expect.gpu_model or "")
    if result.backend != "nccl" or model is None or not model.busbw_floor_gbps:
        return CheckResult("allreduce", "pass", f"{text} (no floor for this setup)", details)
    # The floor is for all 8 GPUs of an NVLink node; fewer ranks are not comparable.
    floor = model.busbw_floor_gbps
    details["floor_gbps"] = floor
    if result.world_size < (expect.gpu_count or 8):
        return CheckResult("allreduce", "warn", f"{text}; floor needs all GPUs", details)
    if result.busbw_gbps < floor:
        return CheckResult("allreduce", "fail", f"{text} < floor {floor} GB/s", details)
    return CheckResult("allreduce", "pass", f"{text} >= floor {floor} GB/s", details)


def run_preflight(
    expect: Expectations,
    *,
    node: str | None = None,
    runner: CommandRunner | None = None,
    torch_info: Callable[[], TorchVersions] = torch_versions,
    allreduce: Callable[[Expectations], CheckResult] | None = check_allreduce,
) -> PreflightReport:
    """Every check, in order; `allreduce=None` leaves the all-reduce out."""
    run = runner or SubprocessRunner()
    report = PreflightReport(node=node or socket.gethostname())
    report.checks.append(check_gpus(run, expect))
    report.checks.append(check_versions(run, expect, torch_info))
    report.checks.append(check_fabric_manager(run, expect))
    report.checks.append(check_topology(run, expect))
    report.checks.append(check_nvlink(run, expect))
    report.checks.append(check_ecc(run, expect))
    report.checks.append(check_infiniband(run, expect))
    if allreduce is not None:
        report.checks.append(allreduce(expect))
    return report


def post_report(
    report: PreflightReport, url: str, *, token: str | None = None, timeout_s: float = 10.0
) -> int:
    """POST the report as JSON; returns the HTTP status. Raises TensoryardError on failure."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(url, json=report.as_dict(), headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TensoryardError(f"could not send the preflight report to {url}: {exc}") from exc
    if response.status_code >= 400:
        raise TensoryardError(
            f"{url} rejected the preflight report: HTTP {response.status_code} "
            f"{response.text[:200]}"
        )
    return response.status_code
