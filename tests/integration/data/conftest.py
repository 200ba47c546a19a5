"""Fixtures of the data integration tests: real HDFS and JuiceFS from ``scripts/storage-testenv``.

The script's ``build`` (Hadoop's jars from Maven Central, the juicefs binary from the Go module
proxy) runs once per machine, in ``.ci/run``; the fixtures here only run ``up``/``down`` on a
private directory and free ports. A backend that is not built skips its tests, or fails them
when ``CI`` is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tensoryard.data.fetchd import SERVICE_DIR, stop_services

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "storage-testenv"
PORTS_PER_ENV = 3


@dataclass(frozen=True)
class StorageEnv:
    """What ``storage-testenv up`` wrote to DIR/env."""

    dir: Path
    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]


def unavailable(what: str, message: str) -> None:
    hint = f"run `scripts/storage-testenv build {what}` (see .ci/run)"
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required in CI: {message}; {hint}", pytrace=False)
    pytest.skip(f"{what} unavailable: {message}; {hint}")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_base() -> int:
    """A base in 27310-27399 whose ports are all free (27300-27309: the script's default)."""
    for base in range(27310, 27400 - PORTS_PER_ENV, PORTS_PER_ENV):
        if all(_port_free(base + i) for i in range(PORTS_PER_ENV)):
            return base
    raise RuntimeError("no free ports in 27310-27399")


@contextlib.contextmanager
def storage_env(what: str) -> Iterator[StorageEnv]:
    """``up`` one backend (``hdfs`` or ``juicefs``) in a private directory; ``down`` after."""
    if not SCRIPT.exists():
        unavailable(what, f"{SCRIPT} is missing")
    env_dir = Path(tempfile.mkdtemp(prefix=f"tensoryard-{what}-"))
    env = os.environ | {"TYARD_STORAGE_PORT_BASE": str(_port_base())}
    proc = subprocess.run(
        [str(SCRIPT), "up", "--dir", str(env_dir), what],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    try:
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            unavailable(what, last)
        values = {}
        for line in (env_dir / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            values[key] = value
        yield StorageEnv(env_dir, values)
    finally:
        subprocess.run(
            [str(SCRIPT), "down", "--dir", str(env_dir)], capture_output=True, timeout=60
        )
        shutil.rmtree(env_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def hdfs() -> Iterator[StorageEnv]:
    """A MiniDFSCluster (NameNode + one DataNode, WebHDFS on) for this module."""
    import importlib.util

    # Not imported here: hdfs-native's runtime does not survive fork, and this process forks
    # DataLoader workers. Uploads go through a subprocess (`hdfs_upload`).
    if importlib.util.find_spec("hdfs_native") is None:
        unavailable("hdfs", "hdfs-native is not installed (pip install 'tensoryard[data]')")
    with storage_env("hdfs") as env:
        yield env


@pytest.fixture(scope="module")
def juicefs() -> Iterator[StorageEnv]:
    """A JuiceFS volume (SQLite metadata, local objects) behind its S3 gateway."""
    with storage_env("juicefs") as env:
        yield env


@pytest.fixture
def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens."""
    return next(p for p in range(27399, 27300, -1) if _port_free(p))


HDFS_UPLOAD = """
import sys, hdfs_native
client = hdfs_native.Client(sys.argv[1])
for pair in sys.argv[2:]:
    local, remote = pair.split("=", 1)
    client.mkdirs(remote.rsplit("/", 1)[0] or "/", create_parent=True)
    with client.create(remote, hdfs_native.WriteOptions(overwrite=True)) as f:
        f.write(open(local, "rb").read())
"""


def hdfs_upload(namenode_url: str, files: dict[str, Path]) -> None:
    """Write local files to HDFS paths ({remote path: local file}) from a subprocess."""
    import sys

    pairs = [f"{local}={remote}" for remote, local in files.items()]
    subprocess.run(
        [sys.executable, "-c", HDFS_UPLOAD, namenode_url, *pairs], check=True, timeout=120
    )


@pytest.fixture(scope="session")
def hdfs_uploader() -> Callable[[str, dict[str, Path]], None]:
    """`hdfs_upload`, for the tests."""
    return hdfs_upload


@pytest.fixture(scope="session", autouse=True)
def _fetch_services_end_with_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """A node fetch service outlives its last reader by its idle period (60 s by default):
    the ones the tests started end with the session."""
    yield
    for folder in tmp_path_factory.getbasetemp().rglob(SERVICE_DIR):
        stop_services(folder.parent)
