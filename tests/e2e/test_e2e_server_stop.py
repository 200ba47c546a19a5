"""A control plane stopped with SIGTERM (what systemd, Kubernetes and `kill` send) shuts down
cleanly: its serving replicas are stopped, not left running without a supervisor.

uvicorn re-raises SIGTERM after its own graceful shutdown; with the default handler that
killed the process before `run_server`'s cleanup ran, and every replica process leaked."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from tests.e2e.conftest import ServerProcess, free_port


def test_sigterm_stops_the_serving_replicas_and_exits(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", port=free_port())
    server.home.mkdir()
    client = server.start()
    try:
        client.create_deployment(model="mock", name="echo", engine="mock", replicas=2)
        deadline = time.monotonic() + 60
        while (dep := client.deployment("echo"))["ready_replicas"] < 2:
            assert time.monotonic() < deadline, dep
            time.sleep(0.2)
        pids = [r["pid"] for r in dep["replica_states"]]
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        client.close()
        server.stop()
    assert server.proc is not None and server.proc.returncode == 143  # SystemExit(128 + 15)
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids):
        assert time.monotonic() < deadline, f"replicas still running: {pids}"
        time.sleep(0.1)
    log = (server.home / "server.out").read_text()
    assert "Traceback" not in log, log[-2000:]


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
