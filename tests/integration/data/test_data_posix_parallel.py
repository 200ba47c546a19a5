"""A parallel filesystem (GPFS, Lustre, a JuiceFS or NFS mount) is read as a POSIX directory.

What matters there, checked on a local directory: many ranks reading the same shard files at
once, and the metadata cost of opening a dataset. Opening lists no directory and opens only
the three metadata files plus each shard once, so a 1,000-rank start costs the metadata
servers 1,000 x (2 + shards read) opens and no listings, whatever the number of files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tensoryard.data import build_loader, write_token_dataset

RANKS = 8
METADATA = ("manifest.json", "index.bin", "shards.json")
CFG = {"seq_len": 256, "global_batch": 16, "seed": 5}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("posix")
    tokens = (np.arange(200_001) % 50_000).astype(np.uint16)
    write_token_dataset(out, [tokens], vocab_size=50_000, eos_id=None, shard_tokens=20_000)
    return out


RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, itertools, json, sys
    events = []
    def hook(event, args):
        if event in ("os.listdir", "os.scandir", "glob.glob"):
            events.append(["list", str(args[0])])
        elif event == "open" and isinstance(args[0], str):
            events.append(["open", args[0]])
    from tensoryard.data import build_loader
    data, rank, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cfg = json.loads(sys.argv[5])
    sys.addaudithook(hook)
    loader = build_loader(data, rank=rank, world_size=world, **cfg)
    digest = hashlib.sha256()
    for batch in itertools.islice(loader, n):
        digest.update(batch.tobytes())
    ours = [e for e in events if e[0] == "list" or e[1].startswith(data)]
    print(json.dumps({"sha": digest.hexdigest(), "events": ours}))
    """
)


def _stream_sha(dataset: Path, rank: int, n: int) -> str:
    loader = build_loader(dataset, rank=rank, world_size=RANKS, **CFG)  # type: ignore[arg-type]
    digest = hashlib.sha256()
    for i, batch in enumerate(loader):
        if i == n:
            break
        digest.update(batch.tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_eight_ranks_reading_the_same_files_at_once_get_their_own_streams(
    dataset: Path,
) -> None:
    n = 40
    argv = [sys.executable, "-c", RANK_SCRIPT, str(dataset)]
    procs = [
        subprocess.Popen(
            [*argv, str(r), str(RANKS), str(n), json.dumps(CFG)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in range(RANKS)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert [r["sha"] for r in results] == [_stream_sha(dataset, r, n) for r in range(RANKS)]
    shards = sorted(p.name for p in dataset.glob("shard-*.tok"))
    for r in results:
        kinds = [e[0] for e in r["events"]]
        opened = [Path(e[1]).name for e in r["events"] if e[0] == "open"]
        # No directory listing; the metadata files once; every shard at most once.
        assert "list" not in kinds
        metadata = set(opened) - set(shards)
        assert {"manifest.json", "index.bin"} <= metadata <= {*METADATA}
        assert all(opened.count(name) == 1 for name in set(opened))
        assert any(name in shards for name in opened)
