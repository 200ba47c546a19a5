"""Fixtures for the image tests: the built CPU image and a private containerd.

The CPU image is built by `tyard images build cpu` (`.ci/run` does it before the tests; cached by
content hash, so an unchanged image is not rebuilt). Here `build()` returns the cached result, or
builds when the inputs changed. Missing tools or no root: the tests skip with the reason, or
fail under CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensoryard.images.builder import TOOLS, BuildResult, build
from tensoryard.images.matrix import default_matrix


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def cpu_image() -> BuildResult:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        _unavailable(
            f"building images needs {', '.join(missing)} (apt-get install debootstrap umoci skopeo)"
        )
    if os.geteuid() != 0:
        _unavailable("building images needs root")
    return build(default_matrix().get("cpu"))


CONTAINERD_CONFIG = """version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


class Containerd:
    """A containerd of our own: its root, state and socket in a private temp dir."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "containerd.sock"
        (directory / "config.toml").write_text(CONTAINERD_CONFIG.format(d=directory))
        self.log = (directory / "containerd.log").open("w")
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(directory / "config.toml")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (directory / "containerd.pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start: {self.tail()}")
            time.sleep(0.2)

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def tail(self) -> str:
        return (self.dir / "containerd.log").read_text()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        # Snapshots are overlay mounts under root: unmount what containerd left, then delete.
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith(str(self.dir)):
                subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    missing = [t for t in ("containerd", "ctr", "runc") if shutil.which(t) is None]
    if missing:
        _unavailable(f"needs {', '.join(missing)} (apt-get install containerd runc)")
    base = Path(tempfile.mkdtemp(prefix=f"tensoryard-{os.getuid()}-containerd-"))
    daemon = Containerd(base)
    try:
        yield daemon
    finally:
        daemon.stop()
