"""A push killed mid-way (the process dies without cleanup) resumes, and its lease lapses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs

PUSH_AND_DIE = textwrap.dedent(
    """
    import os, sys
    from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs

    def die(done, total):
        if done > total // 3:
            os._exit(137)  # like SIGKILL: no finally, no lease release

    config = ArtifactConfig(avg_chunk=16 * 1024, workers=2, batch_chunks=8)
    ArtifactStore(open_blobs(sys.argv[1]), config=config).push(sys.argv[2], progress=die)
    """
)


def test_a_killed_push_resumes_and_its_lease_expires(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = np.random.default_rng(0).integers(0, 256, 3_000_000, np.uint8).tobytes()
    (src / "w.bin").write_bytes(data)
    store_dir = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    died = subprocess.run(
        [sys.executable, "-c", PUSH_AND_DIE, str(store_dir), str(src)], env=env, check=False
    )
    written = list((store_dir / "chunks").rglob("*"))
    leases = list((store_dir / "leases").glob("*.json"))

    assert died.returncode == 137
    assert written and len(leases) == 1  # the dead push's lease is still there
    assert not list((store_dir / "manifests").glob("*"))  # nothing committed
    config = ArtifactConfig(avg_chunk=16 * 1024, workers=2, lease_ttl_s=60)
    later = datetime.now(UTC) + timedelta(hours=1)
    store = ArtifactStore(open_blobs(str(store_dir)), config=config, clock=lambda: later)
    resumed = store.push(src)

    assert 0 < resumed.bytes_new < 0.8 * resumed.bytes_total
    assert store.gc(keep=[resumed.manifest.digest]).leases_expired == 1
    assert not list((store_dir / "leases").glob("*.json"))
    store.pull(resumed.manifest.digest, tmp_path / "out")
    assert (tmp_path / "out" / "w.bin").read_bytes() == data
