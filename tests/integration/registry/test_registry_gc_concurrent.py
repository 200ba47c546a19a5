"""Artifact GC running in another thread while an upload runs, on a real directory store with
the real clock: the upload reads back byte for byte, and once the passes are over no chunk is
left that the kept artifact does not reference (no orphans)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.registry.artifacts import GcResult

GRACE_S = 1.0


def _random_file(path: Path, size: int, seed: int) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def _chunk_files(root: Path) -> set[str]:
    return {p.name for p in (root / "chunks").rglob("*") if p.is_file()}


def test_an_upload_running_during_gc_passes_reads_back_intact_and_leaves_no_orphans(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    config = ArtifactConfig(avg_chunk=16 * 1024, workers=2, batch_chunks=4, gc_grace_s=GRACE_S)
    store = ArtifactStore(open_blobs(str(root)), config=config)
    shared = _random_file(tmp_path / "old" / "a.bin", 6_000_000, 1)
    _random_file(tmp_path / "old" / "b.bin", 2_000_000, 2)
    old = store.push(tmp_path / "old").manifest
    time.sleep(GRACE_S + 0.1)
    assert store.gc(keep=[]).chunks_condemned == len(old.chunk_hashes())  # old was dropped
    time.sleep(GRACE_S + 0.1)  # its chunks may be freed by the next pass now
    # the new artifact re-uses every chunk of old/a.bin (condemned, due) and adds new ones
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "a.bin").write_bytes(shared)
    fresh = _random_file(tmp_path / "new" / "c.bin", 6_000_000, 3)

    passes: list[GcResult] = []
    uploading = threading.Event()
    uploading.set()

    def collect() -> None:
        while uploading.is_set():
            passes.append(store.gc(keep=[]))  # the new manifest is not even registered yet

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        while not passes:  # the upload starts after a pass, so passes overlap it
            time.sleep(0.01)
        pushed = store.push(tmp_path / "new")
        during = len(passes)
    finally:
        uploading.clear()
        collector.join(timeout=60)

    assert during >= 2, "no GC pass overlapped the upload"
    # the registry keeps the new artifact from now on: b.bin's chunks go, nothing else
    for _ in range(2):
        time.sleep(GRACE_S + 0.1)
        store.gc(keep=[pushed.manifest.digest])
    store.pull(pushed.manifest.digest, tmp_path / "out")
    assert (tmp_path / "out" / "a.bin").read_bytes() == shared
    assert (tmp_path / "out" / "c.bin").read_bytes() == fresh
    store.verify(pushed.manifest.digest)
    assert _chunk_files(root) == pushed.manifest.chunk_hashes()  # no orphans left
    # the passes really deleted while the upload ran: b.bin's chunks were due and went
    assert sum(p.chunks_deleted for p in passes) >= len(
        old.chunk_hashes() - pushed.manifest.chunk_hashes()
    )
