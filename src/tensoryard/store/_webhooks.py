"""The webhook outbox: one delivery row per (registry event, receiver) (migration 0010).

A mixin of :class:`tensoryard.store.Store`. The registry writes its events with
``_enqueue_event`` inside the transaction of the change that caused them, so an event exists
iff its change committed. The control plane's delivery loop then:

1. claims due rows (``claim_webhook_deliveries``): a compare-and-set on ``claimed_until``, so
   two control planes never hold the same row at once, and the attempt is counted *before*
   the POST (intent first);
2. sends each one and records the outcome (``finish_webhook_delivery``): delivered, retry at
   a later time, or failed (the dead letter), only if it still holds the claim.

A control plane that dies mid-send leaves a claim that lapses after ``lease_s``; another (or
the restarted one) sends the row again with the same delivery id, which receivers de-duplicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import CursorResult, delete, or_, select, update
from sqlalchemy.orm import Session

from tensoryard.errors import Conflict, FieldIssue, NotFound, SpecError
from tensoryard.store._rows import RowReader
from tensoryard.store.models import WEBHOOK_STATES, WebhookDelivery
from tensoryard.store.records import AuditContext

if TYPE_CHECKING:
    from tensoryard.store.models import AuditEntry

__all__ = ["WEBHOOK_STATES", "WebhookDeliveryRecord", "WebhookOutboxMixin", "WebhookTarget"]

MAX_LIST = 1000
Outcome = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class WebhookTarget:
    """Where the store routes events: a receiver's URL and the events it wants."""

    url: str
    events: frozenset[str]


@dataclass(frozen=True)
class WebhookDeliveryRecord:
    id: int
    delivery_id: str
    event_id: str
    event: str
    hook_url: str
    payload: dict[str, Any]
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str
    created_at: datetime
    delivered_at: datetime | None
    claimed_by: str | None


_record = RowReader(WebhookDeliveryRecord, WebhookDelivery, convert={"payload": dict})


class WebhookOutboxMixin:
    """Outbox rows. Needs ``_tx`` and ``_now`` of the Store."""

    _webhook_targets: tuple[WebhookTarget, ...] = ()

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

        def _audit(
            self,
            s: Session,
            audit: AuditContext | None,
            action: str,
            obj: str,
            *,
            outcome: str = "ok",
            detail: str = "",
        ) -> AuditEntry | None: ...

    def route_webhooks(self, targets: Sequence[tuple[str, Collection[str]]]) -> None:
        """Send registry events to these receivers from now on: ``(url, events)`` pairs.

        The control plane calls it at start with its configured hooks; a store with no
        targets writes no outbox rows."""
        urls = [url for url, _ in targets]
        dupes = sorted({u for u in urls if urls.count(u) > 1})
        if dupes:
            raise SpecError(
                [
                    FieldIssue(
                        "webhooks",
                        f"{dupes[0]} is configured more than once",
                        "give each receiver URL one WebhookConfig (list all its events there)",
                    )
                ]
            )
        self._webhook_targets = tuple(WebhookTarget(u, frozenset(e)) for u, e in targets)

    def _enqueue_event(self, s: Session, event: str, payload: dict[str, Any]) -> None:
        """Add one pending delivery per receiver that wants ``event``, in the caller's
        transaction (the registry change that caused it)."""
        now = self._now()
        event_id = uuid.uuid4().hex
        for target in self._webhook_targets:
            if event not in target.events:
                continue
            s.add(
                WebhookDelivery(
                    delivery_id=uuid.uuid4().hex,
                    event_id=event_id,
                    event=event,
                    hook_url=target.url,
                    payload=payload,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    claimed_by=None,
                    claimed_until=None,
                    last_status=None,
                    last_error="",
                    created_at=now,
                    delivered_at=None,
                )
            )

    def claim_webhook_deliveries(
        self, owner: str, *, limit: int = 16, lease_s: float = 60.0
    ) -> list[WebhookDeliveryRecord]:
        """Claim up to ``limit`` due pending deliveries for ``owner`` for ``lease_s`` seconds,
        counting the attempt about to be made; oldest due first.

        Each row is taken by a conditional UPDATE (status still pending, claim free or
        lapsed), so of two control planes racing for a row exactly one gets it."""
        now = self._now()
        until = now + timedelta(seconds=lease_s)
        free = or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now)
        due = (
            select(WebhookDelivery.id)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
                free,
            )
            .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
            .limit(limit)
        )
        with self._tx("find due webhook deliveries", write=False) as s:
            candidates = list(s.scalars(due))
        if not candidates:  # the common case: no write transaction (SQLite's lock) at all
            return []
        claimed = []
        with self._tx("claim webhook deliveries", write=True) as s:
            for row_id in candidates:
                result = s.execute(
                    update(WebhookDelivery)
                    .where(
                        WebhookDelivery.id == row_id,
                        WebhookDelivery.status == "pending",
                        free,
                    )
                    .values(
                        claimed_by=owner,
                        claimed_until=until,
                        attempts=WebhookDelivery.attempts + 1,
                    )
                    .execution_options(synchronize_session=False)
                )
                if _rowcount(result) == 1:
                    claimed.append(row_id)
            rows = s.scalars(
                select(WebhookDelivery)
                .where(WebhookDelivery.id.in_(claimed))
                .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
                .execution_options(populate_existing=True)
            )
            return [_record(r) for r in rows]

    def release_webhook_claims(self, owner: str) -> int:
        """Drop every claim ``owner`` holds (its process restarted, so none is in flight);
        those rows are due again at once. Returns how many."""
        with self._tx("release webhook claims", write=True) as s:
            result = s.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.claimed_by == owner, WebhookDelivery.status == "pending")
                .values(claimed_by=None, claimed_until=None)
                .execution_options(synchronize_session=False)
            )
            return _rowcount(result)

    def finish_webhook_delivery(
        self,
        row_id: int,
        owner: str,
        outcome: Outcome,
        *,
        status: int | None,
        error: str = "",
        retry_in_s: float = 0.0,
    ) -> bool:
        """Record the outcome of the attempt ``owner`` claimed and release the claim.

        ``retry`` schedules the next attempt ``retry_in_s`` from now. False (nothing written)
        when ``owner`` no longer holds the claim: it lapsed and someone else took the row."""
        now = self._now()
        values: dict[str, Any] = {
            "claimed_by": None,
            "claimed_until": None,
            "last_status": status,
            "last_error": error[:2000],
            "status": "pending" if outcome == "retry" else outcome,
        }
        if outcome == "delivered":
            values["delivered_at"] = now
        if outcome == "retry":
            values["next_attempt_at"] = now + timedelta(seconds=retry_in_s)
        with self._tx(f"record webhook delivery {row_id}", write=True) as s:
            result = s.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == row_id,
                    WebhookDelivery.claimed_by == owner,
                    WebhookDelivery.status == "pending",
                )
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            return _rowcount(result) == 1

    def list_webhook_deliveries(
        self, *, status: str | None = None, event_id: str | None = None, limit: int = 100
    ) -> list[WebhookDeliveryRecord]:
        """Deliveries, newest first, optionally only one status or one event's."""
        if status is not None and status not in WEBHOOK_STATES:
            raise SpecError(
                [FieldIssue("status", f"unknown status {status!r}", f"one of {WEBHOOK_STATES}")]
            )
        query = select(WebhookDelivery).order_by(WebhookDelivery.id.desc())
        if status is not None:
            query = query.where(WebhookDelivery.status == status)
        if event_id is not None:
            query = query.where(WebhookDelivery.event_id == event_id)
        with self._tx("list webhook deliveries", write=False) as s:
            return [_record(r) for r in s.scalars(query.limit(max(1, min(limit, MAX_LIST))))]

    def prune_webhook_deliveries(self, older_than_s: float) -> int:
        """Delete delivered rows whose delivery is older than ``older_than_s`` (the outbox
        would otherwise grow with every event). Pending and failed rows are kept: a failed one
        is the dead letter an admin may still redeliver. Returns how many were deleted."""
        cutoff = self._now() - timedelta(seconds=older_than_s)
        with self._tx("prune webhook deliveries", write=True) as s:
            result = s.execute(
                delete(WebhookDelivery)
                .where(
                    WebhookDelivery.status == "delivered",
                    WebhookDelivery.delivered_at < cutoff,
                )
                .execution_options(synchronize_session=False)
            )
            return _rowcount(result)

    def get_webhook_delivery(self, row_id: int) -> WebhookDeliveryRecord:
        with self._tx(f"read webhook delivery {row_id}", write=False) as s:
            return _record(_delivery(s, row_id))

    def redeliver_webhook(
        self, row_id: int, *, audit: AuditContext | None = None
    ) -> WebhookDeliveryRecord:
        """Put a failed delivery back in the queue: due now, attempts from zero, same
        delivery id. Conflict for one that is pending or was delivered."""
        with self._tx(f"redeliver webhook delivery {row_id}", write=True) as s:
            row = _delivery(s, row_id, lock=True)
            if row.status == "pending":
                raise Conflict(
                    f"webhook delivery {row_id} is still pending (attempt {row.attempts}, next "
                    f"at {row.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC); only failed ones are "
                    "redelivered (fix: wait for it)"
                )
            if row.status == "delivered":
                raise Conflict(
                    f"webhook delivery {row_id} was delivered at "
                    f"{row.delivered_at:%Y-%m-%d %H:%M:%S} UTC; only failed ones are redelivered"
                )
            row.status = "pending"
            row.attempts = 0
            row.next_attempt_at = self._now()
            row.claimed_by = None
            row.claimed_until = None
            s.flush()
            self._audit(s, audit, "webhook.redeliver", f"webhook-delivery/{row_id}")
            return _record(row)


def _delivery(s: Session, row_id: int, *, lock: bool = False) -> WebhookDelivery:
    query = select(WebhookDelivery).where(WebhookDelivery.id == row_id)
    if lock:
        query = query.with_for_update()
    row = s.scalars(query).first()
    if row is None:
        raise NotFound(
            f"webhook delivery {row_id} does not exist "
            "(fix: `tyard models webhooks deliveries` lists them)"
        )
    return row


def _rowcount(result: Any) -> int:
    return int(result.rowcount) if isinstance(result, CursorResult) else 0
