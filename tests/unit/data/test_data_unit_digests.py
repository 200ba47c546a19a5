"""Per-unit checksums (units.bin): written by prepare, checked by verify and by ranged reads of
the shard cache before any unit is used (over file://: a real fsspec store, no services)."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.data.recording_store import RecordingStore

from tensoryard.data import cache as cache_mod
from tensoryard.data import open_dataset, prepare, verify_dataset, write_token_dataset
from tensoryard.data.cache import CacheConfig, ShardCache
from tensoryard.data.format import (
    UNIT_BYTES,
    UNITS_NAME,
    read_index,
    read_manifest,
    read_shard_entries,
    read_units,
    shard_file_name,
    unit_digest,
    write_dataset_metadata,
)
from tensoryard.data.preparation import JOURNAL_NAME
from tensoryard.errors import DataError

U = UNIT_BYTES
SHARD_TOKENS = 5 * U // 4  # uint16: 2.5 MiB shards, units of 1, 1 and 0.5 MiB
N_TOKENS = 3 * SHARD_TOKENS + 1000  # three full shards and a short fourth


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset with units.bin; tests copy it before damaging anything."""
    out = tmp_path_factory.mktemp("units") / "ds"
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 60_000, N_TOKENS, dtype=np.uint16)
    write_token_dataset(out, [tokens], vocab_size=60_000, eos_id=None, shard_tokens=SHARD_TOKENS)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def _strip_units(directory: Path) -> None:
    """Rewrite the metadata as a dataset prepared before units.bin existed."""
    man = read_manifest(directory)
    write_dataset_metadata(
        directory,
        entries=read_shard_entries(directory, man),
        dtype=man.dtype,
        shard_tokens=man.shard_tokens,
        tokenizer=man.tokenizer,
        sources=man.sources,
        extra=man.extra,
    )


def _cache(root: Path, node: Path, store: Any, **config: Any) -> ShardCache:
    cfg = CacheConfig(
        cache_dir=node,
        range_bytes=config.pop("range_bytes", U),
        prefetch_get_bytes=4 * U,
        prefetch_shards=0,
        fetch_service=False,
        **config,
    )
    return ShardCache(root.as_uri(), cfg, store=store)


def _tok(root: Path, i: int) -> bytes:
    return (root / shard_file_name(i)).read_bytes()


def _count_rehashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = cache_mod._hash_file

    def counting(f: Any, path: Path) -> str:
        seen.append(f.key)
        return real(f, path)

    monkeypatch.setattr(cache_mod, "_hash_file", counting)
    return seen


# ------------------------------------------------------------------------- the format


def test_write_token_dataset_writes_unit_digests_of_each_shard(clean: Path) -> None:
    man = read_manifest(clean)
    assert man.units_hash is not None and man.unit_bytes == U
    entries = read_shard_entries(clean, man)
    units = read_units(clean, man, [e.tokens for e in entries])
    assert units is not None and units.num_shards == 4
    for i in range(4):
        data = _tok(clean, i)
        want = b"".join(unit_digest(data[a : a + U]) for a in range(0, len(data), U))
        assert units.of_shard(i) == want
    assert len(units.of_shard(0)) == 3 * 16  # 2.5 MiB: three units, the last one short


def test_prepare_writes_unit_digests_that_match_its_shards(tmp_path: Path) -> None:
    rnd = random.Random(5)
    src = tmp_path / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(250):
            text = "".join(rnd.choices("abcdefgh ", k=rnd.randint(6000, 10000)))
            f.write(json.dumps({"text": text}) + "\n")
    out = prepare([src], "byte", tmp_path / "ds", shard_tokens=700_000).out_dir
    man = read_manifest(out)
    entries = read_shard_entries(out, man)
    assert len(entries) >= 3
    units = read_units(out, man, [e.tokens for e in entries])
    assert units is not None and units.unit_bytes == U
    for i in range(len(entries)):
        data = _tok(out, i)
        assert len(data) > U or i == len(entries) - 1
        want = b"".join(unit_digest(data[a : a + U]) for a in range(0, len(data), U))
        assert units.of_shard(i) == want
    verify_dataset(out)


def test_units_bin_does_not_change_the_dataset_id_and_old_datasets_still_verify(
    clean: Path, tmp_path: Path
) -> None:
    old = _copy(clean, tmp_path / "old")
    _strip_units(old)
    assert not (old / UNITS_NAME).exists()
    raw = json.loads((old / "manifest.json").read_text())
    assert "units_hash" not in raw and "unit_bytes" not in raw
    assert read_manifest(old).dataset_id == read_manifest(clean).dataset_id
    assert read_manifest(old).units_hash is None
    verify_dataset(old)
    _flip(old / shard_file_name(2), U + 5)
    with pytest.raises(DataError, match=r"shard-000002\.tok: content hash blake2b:\w+ differs"):
        verify_dataset(old)


def test_verify_names_the_shard_and_unit_of_a_corrupt_unit(clean: Path, tmp_path: Path) -> None:
    ds = _copy(clean, tmp_path / "ds")
    verify_dataset(ds)
    _flip(ds / shard_file_name(1), 2 * U + 99)
    with pytest.raises(
        DataError, match=rf"shard-000001\.tok: content hash of unit 2 \(bytes \[{2 * U}, "
    ):
        verify_dataset(ds)


def test_a_units_bin_that_does_not_match_the_manifest_is_refused(
    clean: Path, tmp_path: Path
) -> None:
    ds = _copy(clean, tmp_path / "ds")
    _flip(ds / UNITS_NAME, 100)
    man = read_manifest(ds)
    with pytest.raises(DataError, match=r"units\.bin: content hash differs .*units_hash"):
        read_units(ds, man, [e.tokens for e in read_shard_entries(ds, man)])
    assert read_index(ds, man).num_shards == 4  # the rest of the metadata is fine


# ------------------------------------------------------------------------- the cache


def test_a_corrupt_unit_is_refetched_once_then_fails_naming_the_shard(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = _copy(clean, tmp_path / "remote")
    bad_at = U + 12_345  # unit 1 of shard 1
    _flip(remote / shard_file_name(1), bad_at)
    rehashed = _count_rehashes(monkeypatch)
    store = RecordingStore(remote.as_uri())
    name = shard_file_name(1)
    with _cache(remote, tmp_path / "node", store) as cache:
        ds = open_dataset(remote.as_uri(), source=cache)
        # unit 0 of the same shard is fine and read before the damage is met
        got = ds.read(SHARD_TOKENS + 10, 100)
        assert got.tobytes() == _tok(clean, 1)[20:220]
        with pytest.raises(DataError) as err:
            ds.read(SHARD_TOKENS + bad_at // 2, 64)  # a sample inside the damaged unit
        message = str(err.value)
        assert f"{remote.as_uri()}/{name} fails verification twice" in message
        assert f"bytes [{U}, {2 * U})" in message and "units.bin" in message
        assert "re-upload" in message
        assert store.requests_for(name, bad_at) == 2  # fetched, then exactly once more
        assert not [c for c in store.calls if c == (name, 0, -1)]  # no whole download
        assert cache.stats.checksum_mismatches == 2
        # other shards still read, verified unit by unit, with no whole-file rehash
        for i in (0, 2, 3):
            n = len(_tok(clean, i)) // 2
            assert ds.read(i * SHARD_TOKENS, n).tobytes() == _tok(clean, i)
        full = cache.shard_path(2, shard_file_name(2))
        assert full.read_bytes() == _tok(clean, 2) and not full.name.endswith(".part")
        assert rehashed == []
        ds.close()
    # another process of the node gets the same error without fetching anything
    other = RecordingStore(remote.as_uri())
    with _cache(remote, tmp_path / "node", other) as cache2:
        with pytest.raises(DataError, match=rf"{name} fails verification twice.*\[{U}, "):
            cache2.partial_path(1, name)
        assert not [c for c in other.calls if c[0] == name]


def test_a_transient_corruption_costs_one_refetch_and_serves_the_right_bytes(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = shard_file_name(0)
    spoiled: list[int] = []

    def once(key: str, start: int, data: bytes) -> bytes:
        if key == name and not spoiled and start <= 2 * U < start + len(data):
            spoiled.append(start)
            k = 2 * U - start + 7
            return data[:k] + bytes([data[k] ^ 1]) + data[k + 1 :]
        return data

    rehashed = _count_rehashes(monkeypatch)
    store = RecordingStore(clean.as_uri(), alter=once)
    with _cache(clean, tmp_path / "node", store) as cache:
        cache.partial_path(0, name)
        n = len(_tok(clean, 0))
        cache.ensure_ranges(0, [(0, n)])
        assert spoiled and cache.stats.checksum_mismatches == 1
        assert store.requests_for(name, 2 * U) == 2
        final = cache.shard_path(0, name)
        assert final.read_bytes() == _tok(clean, 0)
        assert rehashed == []  # every unit verified as it came: no whole-file pass


def test_the_fetch_service_path_is_verified_too(clean: Path, tmp_path: Path) -> None:
    """A fetch service writes the bytes straight into the partial file; they are read back and
    checked before the units count as in."""
    name = shard_file_name(2)

    class Service:
        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []

        def download_range(
            self, key: str, start: int, stop: int, fd: int, chunk: int, *, demand: bool = True
        ) -> int:
            self.calls.append((start, stop))
            data = bytearray(_tok(clean, 2)[start:stop])
            if len(self.calls) == 1:
                data[0] ^= 0x40
            os.pwrite(fd, bytes(data), start)
            return len(data)

        def download(self, key: str, fd: int, algorithm: str, size: int, chunk: int) -> None:
            return None  # metadata: the process fetches it itself

        def close(self) -> None:
            pass

    service = Service()
    store = RecordingStore(clean.as_uri())
    with _cache(clean, tmp_path / "node", store) as cache:
        cache.files.service = service  # type: ignore[assignment]
        cache.partial_path(2, name)
        cache.ensure_ranges(2, [(10, 20)])
        assert service.calls == [(0, U), (0, U)]
        assert cache.stats.checksum_mismatches == 1
        assert not [c for c in store.calls if c[0] == name]


def test_an_old_dataset_without_units_is_verified_as_a_whole(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = _copy(clean, tmp_path / "remote")
    _strip_units(remote)
    rehashed = _count_rehashes(monkeypatch)
    store = RecordingStore(remote.as_uri())
    with _cache(remote, tmp_path / "node", store) as cache:
        name = shard_file_name(0)
        assert cache._file(0, name).unit_digests is None
        cache.partial_path(0, name)
        cache.ensure_ranges(0, [(0, len(_tok(clean, 0)))])
        assert rehashed == [name]  # the whole-shard hash, once complete
        assert cache.shard_path(0, name).read_bytes() == _tok(clean, 0)
    # damage in the middle of a shard: whole hash fails, a whole download fails, an error
    _flip(remote / shard_file_name(3), 5)
    _flip(remote / shard_file_name(1), U + 3)
    store = RecordingStore(remote.as_uri())
    with _cache(remote, tmp_path / "node2", store) as cache:
        name = shard_file_name(1)
        cache.partial_path(1, name)
        cache.ensure_ranges(1, [(U, U + 10)])  # unchecked until complete: no error yet
        with pytest.raises(DataError, match=rf"{name} fails verification twice.*whole download"):
            cache.ensure_ranges(1, [(0, len(_tok(clean, 1)))])
        assert (name, 0, -1) in store.calls
        assert cache.stats.checksum_mismatches == 2


def test_a_range_size_off_the_unit_size_falls_back_to_the_whole_hash_with_one_warning(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rehashed = _count_rehashes(monkeypatch)
    store = RecordingStore(clean.as_uri())
    with (
        caplog.at_level(logging.WARNING, logger="tensoryard.data.cache"),
        _cache(clean, tmp_path / "node", store, range_bytes=U // 2) as c,
    ):
        for i in (0, 1):
            name = shard_file_name(i)
            c.partial_path(i, name)
            c.ensure_ranges(i, [(0, len(_tok(clean, i)))])
            assert c.shard_path(i, name).read_bytes() == _tok(clean, i)
    assert rehashed == [shard_file_name(0), shard_file_name(1)]
    warnings = [r for r in caplog.records if "not a multiple" in r.getMessage()]
    assert len(warnings) == 1 and "range_bytes" in warnings[0].getMessage()


def test_a_unit_only_fetched_by_an_unverifying_process_is_fetched_again(
    clean: Path, tmp_path: Path
) -> None:
    """A partial file left by a version without per-unit checks (map byte 1) is not trusted."""
    name = shard_file_name(0)
    node = tmp_path / "node"
    with _cache(clean, node, RecordingStore(clean.as_uri())) as first:
        first.partial_path(0, name)
        f = first._file(0, name)
        map_path = first.files._map_path(f)
        part = first.files.part_path(f)
    # an old process fetched unit 0, wrongly, and marked it as in (1)
    with open(part, "r+b") as out:
        out.write(b"\0" * 100)
    map_bytes = bytearray(map_path.read_bytes())
    map_bytes[0] = 1
    map_path.write_bytes(bytes(map_bytes))
    store = RecordingStore(clean.as_uri())
    with _cache(clean, node, store) as cache:
        cache.partial_path(0, name)
        cache.ensure_ranges(0, [(0, 100)])
        assert store.requests_for(name, 0) == 1
        assert part.read_bytes()[:100] == _tok(clean, 0)[:100]
        assert cache.stats.checksum_mismatches == 0


class _Stop(Exception):
    pass


@pytest.mark.parametrize("old_journal", [False, True], ids=["journal", "journal without units"])
def test_a_resumed_prepare_writes_the_same_units_bin(tmp_path: Path, old_journal: bool) -> None:
    """Resumed shards take their digests from the journal, or (a journal written before
    units.bin) from the shard files."""
    rnd = random.Random(9)
    src = tmp_path / "in.jsonl"
    with src.open("w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": "".join(rnd.choices("xyz ", k=900))}) + "\n")
    kw: dict[str, Any] = {"shard_tokens": 5000, "chunk_bytes": 4000}
    prepare([src], "byte", tmp_path / "clean", **kw)

    def stop_midway(done: int, total: int) -> None:
        if done > total // 2:
            raise _Stop

    with pytest.raises(_Stop):
        prepare([src], "byte", tmp_path / "out", progress=stop_midway, **kw)
    journal = tmp_path / "out" / JOURNAL_NAME
    lines = journal.read_text().splitlines()
    assert len(lines) > 1 and all("units" in json.loads(x) for x in lines[1:])
    if old_journal:
        recs = [json.loads(x) for x in lines[1:]]
        kept = [
            json.dumps({k: v for k, v in r.items() if k != "units"}, sort_keys=True) for r in recs
        ]
        journal.write_text("\n".join([lines[0], *kept]) + "\n")
    result = prepare([src], "byte", tmp_path / "out", **kw)
    assert result.resumed_shards > 0
    assert (tmp_path / "out" / UNITS_NAME).read_bytes() == (
        tmp_path / "clean" / UNITS_NAME
    ).read_bytes()
    assert result.manifest.units_hash == read_manifest(tmp_path / "clean").units_hash
    verify_dataset(tmp_path / "out")
