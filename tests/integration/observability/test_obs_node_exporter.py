"""Our InfiniBand and diskstats collectors against Debian's node_exporter on the same trees:
same names, same labels, same values."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tensoryard.observability.infiniband import InfinibandCollector
from tensoryard.observability.registry import render
from tensoryard.observability.storage import DiskstatsCollector

FIXTURES = Path(__file__).resolve().parents[2] / "unit" / "observability" / "fixtures"
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")

pytestmark = pytest.mark.skipif(
    NODE_EXPORTER is None,
    reason="node_exporter not installed (apt-get install prometheus-node-exporter)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[str]:
    """node_exporter reading the recorded sysfs and procfs trees, on loopback."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            NODE_EXPORTER,
            f"--path.sysfs={FIXTURES / 'sys'}",
            f"--path.procfs={FIXTURES / 'proc'}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.diskstats",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "ne.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _samples(text: str, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_infiniband_and_diskstats_match_node_exporter_on_the_same_trees(node_exporter: str):
    theirs_text = urllib.request.urlopen(node_exporter, timeout=5).read().decode()
    registry = CollectorRegistry()
    registry.register(InfinibandCollector(FIXTURES / "sys"))  # type: ignore[arg-type]
    registry.register(DiskstatsCollector(FIXTURES / "proc"))  # type: ignore[arg-type]
    ours_text = render(registry).decode()
    for prefix in ("node_infiniband_", "node_disk_"):
        theirs, ours = _samples(theirs_text, prefix), _samples(ours_text, prefix)
        assert ours, prefix
        common = set(ours) & set(theirs)
        # every series we export under a node_exporter name, node_exporter exports identically
        assert set(ours) - set(theirs) == set(), prefix
        assert {k: ours[k] for k in common} == pytest.approx({k: theirs[k] for k in common})
