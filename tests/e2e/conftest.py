"""A real control plane in a subprocess, on a free port, with its own state directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tensoryard.client import Client
from tensoryard.errors import ClientError

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """Start, kill and restart one control plane; its home survives restarts."""

    home: Path
    port: int
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the next start
    host: str = "127.0.0.1"  # --host: the address it listens on, and pods report to

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Client:
        log = (self.home / "server.out").open("ab")
        cmd = [sys.executable, "-m", "tensoryard.cli.main", "server", "--home", str(self.home)]
        cmd += ["--host", self.host, "--port", str(self.port), *self.extra_args]
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **self.env}
        )
        log.close()
        deadline = time.monotonic() + 60
        probe = Client(self.url, None, timeout=2)
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.home / "server.out").read_text()[-3000:]
            try:
                probe.healthz()
                break
            except ClientError:
                time.sleep(0.2)
        else:
            raise AssertionError("control plane did not start")
        probe.close()
        return self.client()

    def client(self) -> Client:
        token = (self.home / "admin.token").read_text().strip()
        return Client(self.url, token)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a node dies."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _kill_leftovers(home: Path) -> list[str]:
    """Kill any process still running from this test's run dirs; return what was found."""
    found = []
    marker = str(home)
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            env = p.info.get("environ") or {}
            if marker in env.get("TYARD_RUN_DIR", "") or any(
                marker in a for a in (p.info.get("cmdline") or [])
            ):
                found.append(" ".join(p.info.get("cmdline") or []))
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        home=tmp_path / "home", port=free_port(), extra_args=["--cpu-slots", "4"]
    )
    server.home.mkdir()
    yield server
    server.stop()
    _kill_leftovers(server.home)


def wait_for(client: Client, job_id: int, states: set[str], timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if job["state"] in states:
            return job
        time.sleep(0.3)
    events = "\n".join(e["message"] for e in client.events(job_id))
    raise AssertionError(f"job {job_id} stuck in {job.get('state')}; events:\n{events}")


def tyard(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "tensoryard.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[ServerProcess]:
    """A control plane offering this machine as two nodes, n1 and n2 (`--local-nodes`)."""
    server = ServerProcess(
        home=tmp_path / "home",
        port=free_port(),
        extra_args=["--cpu-slots", "4", "--local-nodes", "n1,n2"],
    )
    server.home.mkdir()
    yield server
    server.stop()
    _kill_leftovers(server.home)
