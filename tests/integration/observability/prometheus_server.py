"""A real Prometheus server for the observability tests (Debian's `prometheus` package)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.conftest import free_port

PROMETHEUS = shutil.which("prometheus")


@dataclass
class PrometheusRun:
    base: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    log: Path

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]


@contextmanager
def running_prometheus(config: str, tmp_path: Path) -> Iterator[PrometheusRun]:
    """Prometheus with ``config`` (prometheus.yml text), its data and log under ``tmp_path``;
    stopped when the block ends."""
    assert PROMETHEUS is not None, "prometheus not installed (apt-get install prometheus)"
    path = tmp_path / "prometheus.yml"
    path.write_text(config, encoding="utf-8")
    web = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        yield PrometheusRun(f"http://127.0.0.1:{web}", proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
