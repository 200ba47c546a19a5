"""High availability: two control planes on one PostgreSQL. Both serve the API, one leads the
loop; SIGKILL the leader mid-run and the other takes over within seconds, re-attaches the
running job (no second run) and finishes it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensoryard.client import Client
from tensoryard.errors import ClientError
from tests.e2e.conftest import ServerProcess, _kill_leftovers, free_port, wait_for
from tests.e2e.test_e2e_crash_safety import JOB_SCRIPT, job_spec, ledger

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
LEASE_TTL_S = 3.0


def leader_of(*servers: ServerProcess) -> ServerProcess | None:
    for server in servers:
        try:
            if Client(server.url, None, timeout=2).healthz().get("leader"):
                return server
        except ClientError:
            continue
    return None


@pytest.mark.parametrize("replicas", [2, 3], ids=["two replicas", "three replicas"])
def test_the_follower_takes_over_within_seconds_when_the_leader_is_sigkilled(
    pg_url: str, tmp_path: Path, replicas: int
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "job.py").write_text(JOB_SCRIPT)
    args = ["--cpu-slots", "4", "--db-url", pg_url, "--lease-ttl", str(LEASE_TTL_S)]
    planes = [ServerProcess(home=home, port=free_port(), extra_args=args) for _ in range(replicas)]
    try:
        clients = [p.start() for p in planes]
        deadline = time.monotonic() + 20
        while (leader := leader_of(*planes)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leader is not None, "no replica took the lead"
        followers = [p for p in planes if p is not leader]
        assert leader_of(*followers) is None, "two leaders at once"

        # A follower serves the API: a job submitted there is run by the leader.
        via_follower = clients[planes.index(followers[0])]
        job_id = via_follower.submit(job_spec(tmp_path, "long", 12.0))["id"]
        wait_for(via_follower, job_id, {"RUNNING"}, timeout=60)

        leader.kill()
        killed_at = time.monotonic()
        while (new := leader_of(*followers)) is None and time.monotonic() < killed_at + 30:
            time.sleep(0.1)
        takeover_s = time.monotonic() - killed_at
        print(f"ha: takeover after {takeover_s:.1f}s (lease ttl {LEASE_TTL_S:g}s, {replicas})")
        assert new in followers
        others = [p for p in followers if p is not new]
        assert all(leader_of(p) is None for p in others), "two leaders at once"
        assert takeover_s < LEASE_TTL_S + 5

        job = wait_for(via_follower, job_id, TERMINAL, timeout=120)
        assert job["state"] == "SUCCEEDED", job["reason"]
        assert job["attempts"] == 1, "re-attached, not restarted"
        assert ledger(tmp_path) == {(job_id, 1): 1}
        events = [e["message"] for e in via_follower.events(job_id)]
        assert any("took the lead" in m for m in events), events
    finally:
        for p in planes:
            p.stop()
        _kill_leftovers(home)
