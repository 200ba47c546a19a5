"""Routes of the webhook outbox under /api/v1/webhook-deliveries (platform admins).

Receivers and their secrets are control-plane configuration (``ServerConfig.webhooks``), not
API objects; what the API shows is the outbox: each delivery, its attempts and last answer,
and a way to put a failed (dead-lettered) one back in the queue.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from pydantic import Field

from tensoryard.api.access import Action, Principal
from tensoryard.api.guard import INT32, Guard
from tensoryard.server.schemas import FromRecord, RedactedSpec
from tensoryard.store import Store, WebhookDeliveryRecord

__all__ = ["DeliveryOut", "add_webhook_routes"]

DeliveryId = Annotated[int, Path(ge=1, le=INT32, description="Delivery row id.")]


class DeliveryOut(FromRecord, record=WebhookDeliveryRecord, internal=("claimed_by",)):
    id: int
    delivery_id: str = Field(description="The X-Tyard-Delivery header (same on every attempt).")
    event_id: str = Field(description="Shared by the deliveries of one event to several hooks.")
    event: str
    hook_url: str
    payload: RedactedSpec = Field(description="The event's data (env values, if any, as ***).")
    status: str = Field(description="pending | delivered | failed (gave up: redeliver it)")
    attempts: int
    next_attempt_at: datetime
    last_status: int | None = Field(description="HTTP status of the last attempt (None: no answer)")
    last_error: str
    created_at: datetime
    delivered_at: datetime | None


def add_webhook_routes(
    app: FastAPI,
    *,
    store: Store,
    guard: Guard,
    prefix: str,
    kick: Callable[[], None] = lambda: None,
) -> None:
    """Register the outbox routes; `kick` wakes the delivery loop after a redelivery."""
    tags: list[Any] = ["webhooks"]

    @app.get(f"{prefix}/webhook-deliveries", tags=tags)
    def list_deliveries(
        request: Request,
        status: Annotated[Literal["pending", "delivered", "failed"] | None, Query()] = None,
        event_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{32}$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        who: Principal = Depends(guard.user),
    ) -> list[DeliveryOut]:
        """Webhook deliveries, newest first (platform admins)."""
        guard.check(request, who, Action.WEBHOOK_READ, obj="webhooks")
        rows = store.list_webhook_deliveries(status=status, event_id=event_id, limit=limit)
        return [DeliveryOut.model_validate(r) for r in rows]

    @app.get(f"{prefix}/webhook-deliveries/{{row_id}}", tags=tags)
    def show_delivery(
        row_id: DeliveryId, request: Request, who: Principal = Depends(guard.user)
    ) -> DeliveryOut:
        """One delivery (platform admins)."""
        guard.check(request, who, Action.WEBHOOK_READ, obj=f"webhook-delivery/{row_id}")
        return DeliveryOut.model_validate(store.get_webhook_delivery(row_id))

    @app.post(f"{prefix}/webhook-deliveries/{{row_id}}/redeliver", tags=tags)
    def redeliver(
        row_id: DeliveryId, request: Request, who: Principal = Depends(guard.user)
    ) -> DeliveryOut:
        """Queue a failed delivery again: due now, attempts from zero, same delivery id
        (platform admins; 409 for one that is pending or delivered)."""
        guard.check(request, who, Action.WEBHOOK_MANAGE, obj=f"webhook-delivery/{row_id}")
        row = store.redeliver_webhook(row_id, audit=guard.context(request, who))
        kick()
        return DeliveryOut.model_validate(row)
