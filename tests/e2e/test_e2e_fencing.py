"""Fencing: the leader is frozen (SIGSTOP) in the middle of a write that holds a row lock, for
3x the lease TTL, then resumed. The other replica takes over and makes progress within the TTL
plus the lock timeouts; the old leader, once resumed, changes no row and launches nothing; no
moment has two replicas reporting leader; every job runs exactly once (PostgreSQL)."""

from __future__ import annotations

import os
import signal
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


def _health(server: ServerProcess) -> dict[str, object]:
    try:
        return Client(server.url, None, timeout=0.5).healthz()
    except ClientError:
        return {}


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_leader_frozen_inside_a_locked_write_is_fenced_out(pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "job.py").write_text(JOB_SCRIPT)
    args = ["--cpu-slots", "1", "--db-url", pg_url, "--lease-ttl", str(LEASE_TTL_S)]
    a = ServerProcess(home=home, port=free_port(), extra_args=args)
    a.env = {"TYARD_CRASH_AT": "finish.locked:1", "TYARD_CRASH_SIGNAL": "SIGSTOP"}
    b = ServerProcess(home=home, port=free_port(), extra_args=args)
    try:
        client = a.start()
        deadline = time.monotonic() + 30
        while not _health(a).get("leader"):
            assert time.monotonic() < deadline, "the first replica did not take the lead"
            time.sleep(0.1)
        holder_a = str(_health(a)["holder"])
        b.start()
        # One slot: the first job runs, the others wait for it; its end freezes the leader.
        ids = [client.submit(job_spec(tmp_path, f"j{i}", 0.5))["id"] for i in range(6)]
        assert a.proc is not None
        deadline = time.monotonic() + 60
        while not _stopped(a.proc.pid):
            assert time.monotonic() < deadline, "the leader never reached finish.locked"
            time.sleep(0.05)
        frozen_at = time.monotonic()
        watcher = Client(b.url, (home / "admin.token").read_text().strip())

        # The other replica leads and moves a job while the old one is frozen.
        progress_s = None
        states = {i: watcher.job(i)["state"] for i in ids}
        while time.monotonic() < frozen_at + 3 * LEASE_TTL_S:
            now = {i: watcher.job(i)["state"] for i in ids}
            if progress_s is None and _health(b).get("leader") and now != states:
                progress_s = time.monotonic() - frozen_at
            time.sleep(0.1)
        print(f"fencing: new leader made progress {progress_s}s after the freeze")
        assert progress_s is not None, "no job moved while the old leader was frozen"
        # TTL, plus the idle-in-transaction timeout that ends the frozen write (TTL/2), plus
        # the lock timeout (TTL/3), plus slack for a loaded 2-core machine.
        assert progress_s < LEASE_TTL_S * (1 + 1 / 2 + 1 / 3) + 5

        # Resume the old leader: watch both for two leaders at once, and what it writes.
        resumed_wall = time.time()
        os.kill(a.proc.pid, signal.SIGCONT)
        both = 0
        until = time.monotonic() + 4 * LEASE_TTL_S
        while time.monotonic() < until:
            ha, hb = _health(a), _health(b)
            both += bool(ha.get("leader") and hb.get("leader"))
            time.sleep(0.05)
        assert both == 0, f"two replicas reported leader at once ({both} samples)"

        for i in ids:
            job = wait_for(watcher, i, TERMINAL, timeout=120)
            assert job["state"] == "SUCCEEDED", (i, job["reason"])
        assert all(n == 1 for n in ledger(tmp_path).values()), ledger(tmp_path)
        assert sorted(j for j, _ in ledger(tmp_path)) == sorted(ids)

        # Nothing the old leader's loop wrote carries a time after its resume.
        late = [
            e
            for i in ids
            for e in watcher.events(i)
            if e["replica"] == holder_a
            and e["epoch"] is not None
            and _ts(e["ts"]) > resumed_wall + 0.5
        ]
        assert not late, late
        epochs = {e["epoch"] for i in ids for e in watcher.events(i) if e["epoch"] is not None}
        assert len(epochs) >= 2, epochs  # both leaders' writes are on record, by epoch
        log = (home / "server.out").read_text()
        assert "stepping down" in log or "lost the leader lease" in log
    finally:
        if a.proc is not None and a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()
        _kill_leftovers(home)


def _ts(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value).timestamp()
