"""The artifact store against a real S3 API: `moto_server` on loopback (as the data cache)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest

from tensoryard.registry import ArtifactConfig, ArtifactStore, IntegrityError, S3Blobs

CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.skip(f"moto_server not installed next to {sys.executable} (pip moto[server])")
    port = _free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, "moto_server exited"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def store(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    bucket = f"art-{time.monotonic_ns()}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    blobs = S3Blobs(f"s3://{bucket}/team-a", endpoint_url=endpoint)
    return ArtifactStore(blobs, config=ArtifactConfig(avg_chunk=16 * 1024, workers=4, gc_grace_s=0))


def _files(root: Path) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(rng.integers(0, 256, 400_000, np.uint8).tobytes())
    (root / "config.json").write_text('{"n_layer": 2}')


def test_push_pull_and_dedup_on_s3(store: ArtifactStore, tmp_path: Path) -> None:
    _files(tmp_path / "src")
    first = store.push(tmp_path / "src")
    again = store.push(tmp_path / "src")
    store.pull(first.manifest.digest, tmp_path / "out")

    assert again.bytes_new == 0 and again.manifest.digest == first.manifest.digest
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()


def test_a_corrupted_object_on_s3_is_named(store: ArtifactStore, tmp_path: Path) -> None:
    _files(tmp_path / "src")
    manifest = store.push(tmp_path / "src").manifest
    entry = next(f for f in manifest.files if f.path == "model.safetensors")
    victim = entry.chunks[1].hash
    store.blobs.put(f"chunks/{victim[:2]}/{victim}", b"garbage")

    with pytest.raises(IntegrityError, match=f"chunk {victim} of model.safetensors"):
        store.pull(manifest.digest, tmp_path / "out")


def test_gc_on_s3_leaves_no_orphans(store: ArtifactStore, tmp_path: Path) -> None:
    _files(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "other.bin").write_bytes(np.arange(50_000, dtype=np.int64).tobytes())
    kept = store.push(tmp_path / "a").manifest
    store.push(tmp_path / "b")
    store.config.gc_grace_s = -1  # everything is "old"; condemn, then delete on the next pass

    store.gc(keep=[kept.digest])
    store.gc(keep=[kept.digest])

    left = {b.key.rsplit("/", 1)[-1] for b in store.blobs.list("chunks/")}
    assert left == kept.chunk_hashes()
    store.verify(kept.digest)
