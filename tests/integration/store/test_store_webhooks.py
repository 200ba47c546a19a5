"""The webhook outbox on SQLite and PostgreSQL: rows written with the registry change or not at
all, exclusive claims (also under a race of many threads), retries, dead letter, redelivery."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from tensoryard.errors import Conflict, NotFound, SpecError
from tensoryard.store import Store, utcnow

ALL = (
    "model.version.created",
    "model.version.tagged",
    "model.alias.moved",
    "model.alias.deleted",
)
A = "http://127.0.0.1:1/a"
B = "http://127.0.0.1:1/b"
DIGEST = "ab" * 32


def _routed(store: Store) -> Store:
    store.ensure_team("nlp")
    store.route_webhooks([(A, ALL), (B, ("model.version.created",))])
    return store


def _register(store: Store, **fields: Any) -> int:
    v = store.register_version(
        "nlp", "m", artifact=DIGEST, size_bytes=10, created_by="mo", **fields
    )
    return v.version


def _later(store: Store, seconds: float) -> Store:
    """The same database seen by a control plane whose clock is `seconds` ahead."""
    at = utcnow() + timedelta(seconds=seconds)
    twin = Store(store.engine, store.url, clock=lambda: at)
    twin.route_webhooks([(A, ALL)])
    return twin


def test_each_registry_change_writes_one_row_per_interested_receiver(store: Store) -> None:
    _routed(store)
    _register(store, aliases=["candidate"])
    store.set_alias("nlp", "m", "production", 1)
    store.set_tags("nlp", "m", 1, {"stage": "sft"})
    store.delete_alias("nlp", "m", "candidate")

    rows = list(reversed(store.list_webhook_deliveries()))
    got = [(r.event, r.hook_url) for r in rows]
    assert got == [
        ("model.version.created", A),
        ("model.version.created", B),
        ("model.alias.moved", A),
        ("model.alias.moved", A),
        ("model.version.tagged", A),
        ("model.alias.deleted", A),
    ]
    created_a, created_b = rows[0], rows[1]
    assert created_a.event_id == created_b.event_id  # one event, two receivers
    assert created_a.delivery_id != created_b.delivery_id
    assert created_a.payload["team"] == "nlp" and created_a.payload["version"] == 1
    assert created_a.payload["aliases"] == ["candidate"] and "spec" not in created_a.payload
    assert rows[3].payload == {"team": "nlp", "model": "m", "alias": "production", "version": 1}
    assert rows[4].payload["tags"] == {"stage": "sft"}
    assert all(r.status == "pending" and r.attempts == 0 for r in rows)


def test_a_change_that_fails_leaves_no_event(store: Store) -> None:
    _routed(store)
    _register(store)
    before = len(store.list_webhook_deliveries())

    with pytest.raises(NotFound):
        store.set_alias("nlp", "m", "production", 7)  # no version 7
    with pytest.raises(NotFound):
        _register(store, parent="9")  # no parent version 9: nothing registered
    with pytest.raises(NotFound):
        store.delete_alias("nlp", "m", "nope")

    assert len(store.list_webhook_deliveries()) == before
    assert [v.version for v in store.list_versions("nlp", "m")] == [1]


def test_a_store_without_receivers_writes_no_rows(store: Store) -> None:
    store.ensure_team("nlp")
    _register(store)
    assert store.list_webhook_deliveries() == []


def test_the_same_url_twice_is_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(SpecError, match="configured more than once") as err:
        store.route_webhooks([(A, ALL), (A, ("model.alias.moved",))])
    assert err.value.issues[0].path == "webhooks"


def test_a_claim_is_exclusive_until_it_lapses_and_a_lapsed_owner_cannot_finish(
    store: Store,
) -> None:
    _routed(store)
    _register(store)

    first = store.claim_webhook_deliveries("cp-1", lease_s=60)
    again = store.claim_webhook_deliveries("cp-2", lease_s=60)
    assert [r.hook_url for r in first] == [A, B] and again == []
    assert all(r.attempts == 1 and r.claimed_by == "cp-1" for r in first)

    taken = _later(store, 120).claim_webhook_deliveries("cp-2", lease_s=60)  # cp-1 lapsed
    assert [(r.hook_url, r.attempts) for r in taken] == [(A, 2), (B, 2)]
    assert not store.finish_webhook_delivery(first[0].id, "cp-1", "delivered", status=204)
    assert store.finish_webhook_delivery(taken[0].id, "cp-2", "delivered", status=204)
    done = store.get_webhook_delivery(taken[0].id)
    assert done.status == "delivered" and done.delivered_at is not None
    assert done.claimed_by is None and done.last_status == 204


def test_a_retry_waits_for_its_time_and_a_failure_is_redelivered_once(store: Store) -> None:
    _routed(store)
    store.route_webhooks([(A, ALL)])
    _register(store)
    (row,) = store.claim_webhook_deliveries("cp-1")
    assert store.finish_webhook_delivery(
        row.id, "cp-1", "retry", status=503, error="HTTP 503", retry_in_s=30
    )

    assert store.claim_webhook_deliveries("cp-1") == []  # not due yet
    (retried,) = _later(store, 31).claim_webhook_deliveries("cp-1")
    assert retried.attempts == 2 and retried.last_error == "HTTP 503"
    assert store.finish_webhook_delivery(
        row.id, "cp-1", "failed", status=410, error="HTTP 410 (not retried)"
    )

    (dead,) = store.list_webhook_deliveries(status="failed")
    assert (dead.id, dead.attempts, dead.last_status) == (row.id, 2, 410)
    queued = store.redeliver_webhook(row.id)
    assert (queued.status, queued.attempts, queued.delivery_id) == ("pending", 0, row.delivery_id)
    with pytest.raises(Conflict, match="still pending"):
        store.redeliver_webhook(row.id)
    (sent,) = store.claim_webhook_deliveries("cp-1")
    store.finish_webhook_delivery(sent.id, "cp-1", "delivered", status=200)
    with pytest.raises(Conflict, match="was delivered"):
        store.redeliver_webhook(row.id)
    with pytest.raises(NotFound, match="tyard models webhooks deliveries"):
        store.redeliver_webhook(9999)
    with pytest.raises(SpecError, match="unknown status"):
        store.list_webhook_deliveries(status="lost")


def test_a_restarted_owner_releases_its_claims(store: Store) -> None:
    _routed(store)
    _register(store)
    store.claim_webhook_deliveries("host:8642:/home", lease_s=3600)

    assert store.claim_webhook_deliveries("other") == []
    assert store.release_webhook_claims("host:8642:/home") == 2
    assert len(store.claim_webhook_deliveries("other")) == 2


def test_racing_claimers_take_every_row_exactly_once(store: Store) -> None:
    _routed(store)
    store.route_webhooks([(A, ALL), (B, ALL)])
    for _ in range(20):
        _register(store)
    rows = store.list_webhook_deliveries(limit=1000)
    barrier = threading.Barrier(6)

    def claimer(i: int) -> list[int]:
        barrier.wait()
        got: list[int] = []
        while batch := store.claim_webhook_deliveries(f"cp-{i}", limit=3):
            got += [r.id for r in batch]
        return got

    with ThreadPoolExecutor(6) as pool:
        claimed = [row for ids in pool.map(claimer, range(6)) for row in ids]

    assert Counter(claimed) == Counter({r.id: 1 for r in rows})
    assert all(r.attempts == 1 for r in store.list_webhook_deliveries(limit=1000))
