"""Periodic upkeep of the control plane's stores, run by the leader only.

- **Artifact GC** every ``artifact_gc_interval_s``: one pass of
  :meth:`tensoryard.registry.ArtifactStore.gc` keeping every registered version's artifact (what
  `tyard models gc` does by hand). The pass is safe while uploads run (chunks are condemned
  first and freed only after the grace period, never while an upload's lease claims them). The
  last pass is read from the audit log (action ``artifact.gc``, a manual pass included), so a
  restarted control plane or another replica does not run it again early.
- **Webhook outbox pruning** every ``PRUNE_EVERY_S``: delivered rows older than
  ``webhook_keep_s`` are deleted; pending and failed (dead-letter) rows are kept.

Each pass writes an audit line (actor ``system``) and metrics; a failed pass is logged and
counted, and the next interval tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, Counter

from tensoryard.registry import ArtifactStore
from tensoryard.store import Store
from tensoryard.store.records import AuditContext

__all__ = ["Housekeeper", "HousekeepingMetrics"]

log = logging.getLogger("tensoryard.housekeeping")

SYSTEM = AuditContext(actor="system")
GC_ACTION = "artifact.gc"
PRUNE_EVERY_S = 3600.0


class HousekeepingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.gc_runs = Counter(
            "tyard_artifact_gc_runs",
            "Scheduled artifact GC passes, by outcome (ok, error)",
            ["outcome"],
            registry=registry,
        )
        self.gc_freed_bytes = Counter(
            "tyard_artifact_gc_freed_bytes",
            "Bytes of unreferenced chunks freed by scheduled artifact GC passes",
            registry=registry,
        )
        self.webhooks_pruned = Counter(
            "tyard_webhook_deliveries_pruned",
            "Delivered webhook outbox rows deleted after the keep period",
            registry=registry,
        )


class Housekeeper:
    """Runs the passes when due, while ``is_leader()`` holds; ``tick`` is one check."""

    def __init__(
        self,
        store: Store,
        artifacts: ArtifactStore,
        *,
        is_leader: Callable[[], bool],
        metrics: HousekeepingMetrics,
        artifact_gc_interval_s: float | None,
        webhook_keep_s: float | None,
        tick_s: float = 30.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.is_leader = is_leader
        self.metrics = metrics
        self.gc_interval_s = artifact_gc_interval_s
        self.webhook_keep_s = webhook_keep_s
        self.tick_s = tick_s
        self.clock = clock
        self._pruned_at: datetime | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.gc_interval_s is None and self.webhook_keep_s is None:
            return
        self._thread = threading.Thread(target=self._run, name="tyard-housekeeping", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # the database went away mid-pass: the next tick retries
                log.exception("housekeeping pass failed")

    def tick(self) -> None:
        """Run each pass that is due (nothing unless this replica leads)."""
        if not self.is_leader():
            return
        now = self.clock()
        if self.gc_interval_s is not None and self._gc_due(now):
            self.collect_garbage()
        if self.webhook_keep_s is not None and (
            self._pruned_at is None or (now - self._pruned_at).total_seconds() >= PRUNE_EVERY_S
        ):
            self._pruned_at = now
            self.prune_webhooks()

    def _gc_due(self, now: datetime) -> bool:
        assert self.gc_interval_s is not None
        since = now - timedelta(seconds=self.gc_interval_s)
        try:
            recent = self.store.list_audit(action=GC_ACTION, since=since, limit=1)
        except Exception:
            log.exception("cannot read the last artifact GC pass from the audit log")
            return False
        return not recent

    def collect_garbage(self) -> None:
        started = time.monotonic()
        try:
            result = self.artifacts.gc(keep=self.store.registry_artifacts())
        except Exception as exc:
            self.metrics.gc_runs.labels("error").inc()
            log.exception("scheduled artifact GC failed; the next interval retries")
            self.store.record_audit(
                SYSTEM, GC_ACTION, "artifacts", outcome="error", detail=f"scheduled: {exc}"
            )
            return
        self.metrics.gc_runs.labels("ok").inc()
        self.metrics.gc_freed_bytes.inc(result.bytes_deleted)
        detail = (
            f"scheduled: freed {result.chunks_deleted} chunks ({result.bytes_deleted} bytes), "
            f"condemned {result.chunks_condemned}, kept {result.chunks_kept}, "
            f"{result.manifests_deleted} manifests and {result.leases_expired} expired leases "
            f"removed in {time.monotonic() - started:.1f} s"
        )
        self.store.record_audit(SYSTEM, GC_ACTION, "artifacts", detail=detail)
        log.info("artifact GC: %s", detail)

    def prune_webhooks(self) -> None:
        assert self.webhook_keep_s is not None
        try:
            pruned = self.store.prune_webhook_deliveries(self.webhook_keep_s)
        except Exception:
            log.exception("pruning delivered webhook rows failed; the next pass retries")
            return
        self.metrics.webhooks_pruned.inc(pruned)
        if pruned:
            log.info(
                "pruned %d delivered webhook rows older than %.0f s", pruned, self.webhook_keep_s
            )
