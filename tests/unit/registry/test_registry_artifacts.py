"""The artifact store on a real local directory: round trips, dedup, resume, corruption, GC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tensoryard.errors import DataError, NotFound
from tensoryard.registry import ArtifactConfig, ArtifactStore, IntegrityError, open_blobs

AVG = 16 * 1024  # small chunks so that small test files have many


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)  # the files' mtimes are real

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _store(root: Path, clock: Clock | None = None, **config: float) -> ArtifactStore:
    cfg = ArtifactConfig(avg_chunk=AVG, workers=4, batch_chunks=8, **config)  # type: ignore[arg-type]
    return ArtifactStore(open_blobs(str(root)), config=cfg, clock=clock or Clock())


def _random(path: Path, size: int, seed: int) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def _chunk_files(root: Path) -> dict[str, Path]:
    return {p.name: p for p in (root / "chunks").rglob("*") if p.is_file()}


def test_a_directory_round_trips_byte_for_byte_and_a_second_push_stores_nothing(
    tmp_path: Path,
) -> None:
    src = tmp_path / "ckpt"
    _random(src / "model.safetensors", 900_000, 1)
    _random(src / "dcp" / "__0_0.distcp", 300_000, 2)
    (src / "empty.txt").write_bytes(b"")
    store = _store(tmp_path / "store")

    first = store.push(src)
    again = store.push(src)
    out = tmp_path / "out"
    store.pull(first.manifest.digest, out)

    assert first.bytes_new == first.bytes_total == 1_200_000
    assert first.chunks_total > 20
    assert again.manifest.digest == first.manifest.digest
    assert again.bytes_new == 0
    for rel in ("model.safetensors", "dcp/__0_0.distcp", "empty.txt"):
        assert (out / rel).read_bytes() == (src / rel).read_bytes()


@pytest.mark.parametrize("edit", ["10% changed in place", "10% inserted in the middle"])
def test_a_checkpoint_changed_by_ten_percent_stores_about_ten_percent_new_bytes(
    tmp_path: Path, edit: str
) -> None:
    size = 4_000_000
    data = bytearray(_random(tmp_path / "a" / "w.bin", size, 3))
    patch = np.random.default_rng(4).integers(0, 256, size // 10, dtype=np.uint8).tobytes()
    at = size // 2
    if edit.startswith("10% changed"):
        data[at : at + len(patch)] = patch
    else:
        data[at:at] = patch
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "w.bin").write_bytes(bytes(data))
    store = _store(tmp_path / "store")

    store.push(tmp_path / "a")
    second = store.push(tmp_path / "b")

    assert 0.09 <= second.bytes_new / second.bytes_total <= 0.15


def test_an_interrupted_upload_resumes_and_skips_the_chunks_already_stored(
    tmp_path: Path,
) -> None:
    _random(tmp_path / "src" / "w.bin", 2_000_000, 5)
    store = _store(tmp_path / "store")
    calls: list[int] = []

    def crash_after_first_batch(done: int, total: int) -> None:
        calls.append(done)
        raise KeyboardInterrupt("connection lost")

    with pytest.raises(KeyboardInterrupt):
        store.push(tmp_path / "src", progress=crash_after_first_batch)
    stored_before = len(_chunk_files(tmp_path / "store"))
    resumed = store.push(tmp_path / "src")

    assert stored_before >= 8
    assert resumed.bytes_new < resumed.bytes_total
    assert resumed.chunks_new == resumed.chunks_total - stored_before
    assert not list((tmp_path / "store" / "leases").glob("*"))  # lease released
    store.pull(resumed.manifest.digest, tmp_path / "out")
    assert (tmp_path / "out" / "w.bin").read_bytes() == (tmp_path / "src" / "w.bin").read_bytes()


def test_a_corrupted_chunk_is_detected_on_read_and_named(tmp_path: Path) -> None:
    _random(tmp_path / "src" / "w.bin", 500_000, 6)
    store = _store(tmp_path / "store")
    manifest = store.push(tmp_path / "src").manifest
    victim = manifest.files[0].chunks[3]
    path = _chunk_files(tmp_path / "store")[victim.hash]
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))

    with pytest.raises(IntegrityError) as err:
        store.pull(manifest.digest, tmp_path / "out")

    assert err.value.chunk == victim.hash
    assert err.value.path == "w.bin"
    assert err.value.offset == sum(c.size for c in manifest.files[0].chunks[:3])
    assert victim.hash in str(err.value) and "w.bin" in str(err.value)
    assert not list((tmp_path / "out").glob("*w.bin*"))  # nothing half-written left behind
    with pytest.raises(IntegrityError):
        store.verify(manifest.digest)


def test_a_missing_chunk_is_named_too(tmp_path: Path) -> None:
    _random(tmp_path / "src" / "w.bin", 200_000, 7)
    store = _store(tmp_path / "store")
    manifest = store.push(tmp_path / "src").manifest
    victim = manifest.files[0].chunks[0]
    _chunk_files(tmp_path / "store")[victim.hash].unlink()

    with pytest.raises(IntegrityError, match=f"chunk {victim.hash} of w.bin at byte 0 is missing"):
        store.verify(manifest.digest)


@pytest.mark.parametrize(
    ("digest", "error", "match"),
    [
        ("nothex", DataError, "is not an artifact digest"),
        ("0" * 64, NotFound, "is not in the artifact store"),
    ],
    ids=["a malformed digest", "a digest never pushed"],
)
def test_bad_digests_get_clear_errors(
    tmp_path: Path, digest: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _store(tmp_path / "store").pull(digest, tmp_path / "out")


def test_pushing_a_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        _store(tmp_path / "store").push(tmp_path / "nope")


def test_gc_deletes_unreferenced_chunks_only_after_the_grace_period(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path / "store", clock, gc_grace_s=60)
    _random(tmp_path / "a" / "w.bin", 300_000, 8)
    _random(tmp_path / "b" / "w.bin", 300_000, 9)
    kept = store.push(tmp_path / "a").manifest
    dropped = store.push(tmp_path / "b").manifest
    clock.advance(3600)  # both manifests are older than the grace period now

    first = store.gc(keep=[kept.digest])
    assert first.chunks_deleted == 0  # condemned, not deleted
    assert first.chunks_condemned == len(dropped.chunk_hashes())
    clock.advance(30)
    assert store.gc(keep=[kept.digest]).chunks_deleted == 0  # grace not over yet
    clock.advance(60)
    second = store.gc(keep=[kept.digest])

    assert second.chunks_deleted == len(dropped.chunk_hashes())
    assert set(_chunk_files(tmp_path / "store")) == kept.chunk_hashes()  # no orphans left
    store.verify(kept.digest)
    with pytest.raises(NotFound):
        store.manifest(dropped.digest)


def test_gc_running_during_an_upload_never_deletes_what_the_upload_relies_on(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = _store(tmp_path / "store", clock, gc_grace_s=60)
    _random(tmp_path / "old" / "w.bin", 1_000_000, 10)
    old = store.push(tmp_path / "old").manifest
    clock.advance(3600)
    store.gc(keep=[])  # the old artifact was dropped: its chunks are condemned
    # the new upload shares all its chunks with the condemned old one, plus new ones
    new_src = tmp_path / "new" / "w.bin"
    new_src.parent.mkdir()
    new_src.write_bytes((tmp_path / "old" / "w.bin").read_bytes() + b"tail" * 100_000)
    passes: list[int] = []

    def gc_meanwhile(done: int, total: int) -> None:
        clock.advance(120)
        passes.append(store.gc(keep=[]).chunks_deleted)

    pushed = store.push(new_src.parent, progress=gc_meanwhile)
    clock.advance(120)
    store.gc(keep=[pushed.manifest.digest])

    assert len(passes) >= 3
    assert pushed.bytes_new >= len(old.chunk_hashes()) and pushed.chunks_new > 0
    store.pull(pushed.manifest.digest, tmp_path / "out")
    assert (tmp_path / "out" / "w.bin").read_bytes() == new_src.read_bytes()


def test_any_fsspec_filesystem_works_as_a_backend(tmp_path: Path) -> None:
    _random(tmp_path / "src" / "w.bin", 300_000, 11)
    url = f"memory://tyard-test-{tmp_path.name}"
    store = ArtifactStore(open_blobs(url), config=ArtifactConfig(avg_chunk=AVG, workers=2))

    pushed = store.push(tmp_path / "src")
    store.pull(pushed.manifest.digest, tmp_path / "out")

    assert (tmp_path / "out" / "w.bin").read_bytes() == (tmp_path / "src" / "w.bin").read_bytes()
    assert store.push(tmp_path / "src").bytes_new == 0


def test_a_push_returns_only_after_its_chunks_and_manifest_are_flushed_to_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _random(tmp_path / "src" / "w.bin", 500_000, 9)
    store = _store(tmp_path / "store")
    events: list[str] = []
    put, sync = store.blobs.put, store.blobs.sync

    def recording_put(key: str, data: bytes | memoryview) -> None:
        put(key, data)
        events.append(key.split("/")[0])

    def recording_sync() -> None:
        sync()  # the real flush (syncfs on Linux)
        events.append("sync")

    monkeypatch.setattr(store.blobs, "put", recording_put)
    monkeypatch.setattr(store.blobs, "sync", recording_sync)
    pushed = store.push(tmp_path / "src")

    puts = [e for e in events if e != "sync"]
    assert puts.count("chunks") == pushed.chunks_new > 1
    assert events.index("manifests") > max(i for i, e in enumerate(events) if e == "chunks")
    # one flush for everything, after the last write and before push returns
    assert events.count("sync") == 1
    assert events[-2:] == ["manifests", "sync"]
