"""The API's authentication cache: a token's principal is reused for a few seconds without a
database read, yet a revocation or membership change made through the same store is honoured
at once, one made by another control plane within the cache time, and an expiry exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.security import HTTPAuthorizationCredentials
from starlette.requests import Request

from tensoryard.api.guard import Guard
from tensoryard.api.limits import RateLimiter
from tensoryard.errors import Unauthenticated
from tensoryard.store import Store


class Ticks:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Wall:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _request() -> Request:
    return Request({"type": "http", "client": ("127.0.0.1", 1), "headers": [], "method": "GET"})


def _creds(token: str) -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)


class CountingStore:
    """The real store, counting authenticate() calls (database reads)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def authenticate(self, token: str) -> object:
        self.reads += 1
        return self.store.authenticate(token)


def _guard(store: object, ticks: Ticks) -> Guard:
    limiter = RateLimiter(rate_per_s=1000, burst=1000, clock=ticks)
    return Guard(store, limiter, monotonic=ticks)  # type: ignore[arg-type]


def test_a_cached_token_skips_the_database_until_the_cache_time_passes(store: Store) -> None:
    store.ensure_user("ana")
    token = store.create_token("ana").token
    ticks = Ticks()
    counted = CountingStore(store)
    guard = _guard(counted, ticks)
    assert guard.cached_user(_request(), _creds(token)) is None  # never seen: not cached
    assert guard.user(_request(), _creds(token)).name == "ana"
    for _ in range(5):
        assert guard.user(_request(), _creds(token)).name == "ana"
        who = guard.cached_user(_request(), _creds(token))
        assert who is not None and who.name == "ana"
    assert counted.reads == 1
    ticks.t += guard.cache_s + 0.1
    assert guard.cached_user(_request(), _creds(token)) is None
    guard.user(_request(), _creds(token))
    assert counted.reads == 2


def test_a_revocation_through_the_same_store_is_refused_at_once(store: Store) -> None:
    store.ensure_user("ana")
    issued = store.create_token("ana")
    guard = _guard(store, Ticks())
    guard.user(_request(), _creds(issued.token))
    store.revoke_token(issued.record.id)
    assert guard.cached_user(_request(), _creds(issued.token)) is None
    with pytest.raises(Unauthenticated, match="revoked"):
        guard.user(_request(), _creds(issued.token))


def test_a_membership_change_through_the_same_store_is_seen_at_once(store: Store) -> None:
    store.ensure_user("ana")
    store.ensure_team("vision")
    token = store.create_token("ana").token
    guard = _guard(store, Ticks())
    assert "vision" not in guard.user(_request(), _creds(token)).roles
    store.set_member("vision", "ana", "viewer")
    assert guard.user(_request(), _creds(token)).roles.get("vision") == "viewer"


def test_another_control_planes_revocation_holds_within_the_cache_time(
    store: Store,
) -> None:
    other = Store.open(store.url, migrate=False)  # a second replica on the same database
    try:
        other.ensure_user("ana")
        issued = other.create_token("ana")
        ticks = Ticks()
        guard = _guard(store, ticks)
        guard.user(_request(), _creds(issued.token))
        other.revoke_token(issued.record.id)
        ticks.t += guard.cache_s / 2  # still cached here: this plane did not see the change
        assert guard.user(_request(), _creds(issued.token)).name == "ana"
        ticks.t += guard.cache_s  # past the cache time: read again, refused
        with pytest.raises(Unauthenticated, match="revoked"):
            guard.user(_request(), _creds(issued.token))
    finally:
        other.close()


def test_an_expiring_token_is_refused_at_its_expiry_even_when_cached(
    migrated_sqlite_url: str,
) -> None:
    wall = Wall()
    store = Store.open(migrated_sqlite_url, clock=wall)
    try:
        store.ensure_user("ana")
        token = store.create_token("ana", expires_at=wall.now + timedelta(minutes=10)).token
        ticks = Ticks()
        guard = _guard(store, ticks)
        guard.user(_request(), _creds(token))
        wall.now += timedelta(minutes=10)  # expired, though cached a moment ago
        assert guard.cached_user(_request(), _creds(token)) is None
        with pytest.raises(Unauthenticated, match="expired"):
            guard.user(_request(), _creds(token))
    finally:
        store.close()


def test_a_cache_time_of_zero_reads_every_time(store: Store) -> None:
    store.ensure_user("ana")
    token = store.create_token("ana").token
    counted = CountingStore(store)
    ticks = Ticks()
    guard = Guard(
        counted,  # type: ignore[arg-type]
        RateLimiter(rate_per_s=1000, burst=1000, clock=ticks),
        cache_s=0,
        monotonic=ticks,
    )
    for _ in range(3):
        guard.user(_request(), _creds(token))
    assert counted.reads == 3
