"""From firing alerts to health actions: the pure first step of the closed health loop.

Every rule in deploy/prometheus/rules carries a ``health_action`` label: ``drain_node`` (cordon
the node, requeue its jobs from their last checkpoint), ``restart_job`` (restart the job from
its last checkpoint) or ``notify`` (people only). ``decide`` turns the alerts Prometheus or
Alertmanager reports (their ``labels`` and ``state``) into one action per node or job; the
control plane carries them out (not here: this module does no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["HealthAction", "decide", "describe", "node_of"]


@dataclass(frozen=True)
class HealthAction:
    """Drain `target` (a node) or restart `target` (a job of `team`), for `reasons`."""

    kind: str  # drain_node | restart_job
    target: str
    team: str = ""
    reasons: tuple[str, ...] = ()


def node_of(labels: Mapping[str, str]) -> str:
    """The node an alert is about: DCGM's Hostname, else the scrape instance without its port."""
    host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance", "")
    if host.startswith("["):  # [ipv6]:port
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def decide(alerts: Iterable[Mapping[str, Any]]) -> list[HealthAction]:
    """One action per node to drain and per job to restart, from the firing alerts only.

    A job on a node being drained is requeued with the drain; it gets no restart of its own.
    """
    drains: dict[str, list[str]] = {}
    restarts: dict[tuple[str, str], list[str]] = {}
    for alert in alerts:
        if alert.get("state", "firing") != "firing":
            continue
        labels = alert.get("labels", {})
        action, name = labels.get("health_action"), labels.get("alertname", "?")
        if action == "drain_node" and node_of(labels):
            drains.setdefault(node_of(labels), []).append(_reason(name, labels))
        elif action == "restart_job" and labels.get("job"):
            key = (labels["job"], labels.get("team", ""))
            restarts.setdefault(key, []).append(_reason(name, labels))
    out = [
        HealthAction("drain_node", n, reasons=tuple(sorted(set(r))))
        for n, r in sorted(drains.items())
    ]
    out += [
        HealthAction("restart_job", job, team, tuple(sorted(set(r))))
        for (job, team), r in sorted(restarts.items())
        if not _on_drained_node(job, alerts, drains)
    ]
    return out


def _reason(name: str, labels: Mapping[str, str]) -> str:
    keys = ("gpu", "xid", "device", "port", "check", "outcome", "rank", "op")
    detail = [f"{k}={labels[k]}" for k in keys if labels.get(k)]
    return f"{name}({', '.join(detail)})" if detail else name


def _on_drained_node(
    job: str, alerts: Iterable[Mapping[str, Any]], drains: Mapping[str, Any]
) -> bool:
    """True when a drain alert names this job (a GPU alert carries the job holding the GPU)."""
    return any(
        a.get("labels", {}).get("job") == job
        and node_of(a.get("labels", {})) in drains
        and a.get("labels", {}).get("health_action") == "drain_node"
        for a in alerts
    )


_REASON = re.compile(r"^(?P<name>\w+)\((?P<detail>[^()]*)\)$")
_WORDS = {
    "GpuFatalXid": "XID {xid} on GPU {gpu}",
    "GpuRowRemapFailure": "row remapping failed on GPU {gpu}",
    "GpuUncorrectableEcc": "uncorrectable ECC errors on GPU {gpu}",
    "GpuNvlinkRecoveryErrors": "NVLink recovery errors on GPU {gpu}",
    "InfinibandPortDown": "InfiniBand port {device}/{port} down",
    "HealthCheckFailed": "health check {check} failed",
}
# the same, when the report says how it failed (tyard agent's own checks do)
_WORDS_WITH_OUTCOME = {"HealthCheckFailed": "health check `{check}` failed ({outcome})"}


def describe(reasons: Iterable[str]) -> str:
    """What a person reads: ("GpuFatalXid(gpu=2, xid=79)",) -> "XID 79 on GPU 2"."""
    out = []
    for reason in reasons:
        match = _REASON.match(reason)
        template = _WORDS.get(match.group("name")) if match else None
        if match is None or template is None:
            out.append(reason)
            continue
        labels = dict(
            part.split("=", 1) for part in match.group("detail").split(", ") if "=" in part
        )
        if "outcome" in labels:
            template = _WORDS_WITH_OUTCOME.get(match.group("name"), template)
        try:
            out.append(template.format(**labels).replace("/?", ""))
        except KeyError:
            out.append(reason)
    return "; ".join(out)
