"""Hostile input at the door: bodies over the limit get 413, bursts over the per-token rate get
429 with Retry-After, and one token's flood does not slow another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tensoryard.api.limits import RateLimiter
from tensoryard.errors import RateLimited
from tensoryard.executors.local import LocalExecutor
from tensoryard.server.app import create_app
from tensoryard.server.auth import bootstrap_admin
from tensoryard.store import Store


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path, clock: FakeClock) -> Iterator[TestClient]:
    token = bootstrap_admin(sqlite_store, tmp_path / "admin.token")
    app = create_app(
        store=sqlite_store,
        executor=LocalExecutor(),
        runs_dir=tmp_path / "runs",
        max_body_bytes=1000,
        rate_limit_per_s=1.0,
        rate_limit_burst=3,
        clock=clock,
    )
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def test_a_body_over_the_limit_gets_413_with_the_limit_and_a_fix(api: TestClient) -> None:
    answer = api.post("/api/v1/teams", json={"name": "big", "description": "x" * 2000})
    assert answer.status_code == 413
    message = answer.json()["message"]
    assert "limit of 1000 bytes" in message and "fix:" in message


def test_a_streamed_body_without_a_length_is_cut_off_at_the_limit(api: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"name": "big", "description": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    answer = api.post(
        "/api/v1/teams", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 413


def test_a_body_under_the_limit_passes(api: TestClient) -> None:
    assert api.post("/api/v1/teams", json={"name": "small"}).status_code == 201


@pytest.mark.parametrize(
    "url",
    ["/api/v1/jobs?team=%00nlp", "/api/v1/jobs?user=a%00b", "/api/v1/teams/nl%00p/members"],
    ids=["a team filter", "a user filter", "a path"],
)
def test_a_nul_character_in_the_url_gets_422_before_any_route(api: TestClient, url: str) -> None:
    answer = api.get(url)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["path"] == "url"


@pytest.mark.parametrize("after", [2**31 - 1, 2**31], ids=["the largest id", "one past it"])
def test_ids_in_queries_stay_within_the_databases_integers(api: TestClient, after: int) -> None:
    # 32-bit id columns on PostgreSQL: a larger value would fail in the database (503)
    answer = api.get("/api/v1/audit", params={"after_id": after})
    assert answer.status_code == (200 if after < 2**31 else 422)


def test_a_burst_over_the_rate_gets_429_with_retry_after_until_time_passes(
    api: TestClient, clock: FakeClock
) -> None:
    for _ in range(3):
        assert api.get("/api/v1/teams").status_code == 200
    refused = api.get("/api/v1/teams")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert "retry after 1s" in refused.json()["message"]
    clock.now += 1.0
    assert api.get("/api/v1/teams").status_code == 200
    assert api.get("/api/v1/teams").status_code == 429


def test_guessing_tokens_is_rate_limited_per_address(api: TestClient) -> None:
    codes = [
        api.get("/api/v1/teams", headers={"Authorization": f"Bearer guess-{i}"}).status_code
        for i in range(5)
    ]
    assert codes == [401, 401, 401, 429, 429]


def test_the_limiter_keeps_one_bucket_per_key() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=2.0, burst=2, clock=clock)
    limiter.check("token:a")
    limiter.check("token:a")
    with pytest.raises(RateLimited) as err:
        limiter.check("token:a")
    assert err.value.retry_after_s == pytest.approx(0.5)
    limiter.check("token:b")  # another token is not slowed
    clock.now += 0.5
    limiter.check("token:a")


def test_the_limiter_forgets_idle_buckets_instead_of_growing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(RateLimiter, "MAX_KEYS", 10)
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=clock)
    for i in range(10):
        limiter.check(f"address:{i}")
    clock.now += 5
    limiter.check("address:new")
    assert len(limiter._buckets) == 1


def test_no_module_starts_a_command_through_a_shell() -> None:
    import ast

    import tensoryard

    root = Path(tensoryard.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            shell = any(
                k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords
            )
            func = ast.unparse(node.func)
            if shell or func in ("os.system", "os.popen", "subprocess.getoutput"):
                offenders.append(f"{path.relative_to(root)}:{node.lineno} {func}")
    assert offenders == []
