"""Sharded (DCP) checkpoints of an FSDP2 model under real torchrun (gloo, CPU): async saves
whose snapshot does not move while training goes on, resume by a different number of ranks,
and a rank killed while committing leaves the previous checkpoint as the latest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensoryard.runtime.checkpoint import Checkpointer, verify

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_sharded_worker.py")


def torchrun(nproc: int, phase: str, ckpt: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", str(WORKER), phase, str(ckpt), str(out)]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def load(path: Path) -> dict[str, Any]:
    return dict(torch.load(path, weights_only=False))


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("sharded")
    proc = torchrun(2, "train", root / "ckpt", root / "train.pt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root, load(root / "train.pt")


def test_two_ranks_write_committed_sharded_checkpoints(
    trained: tuple[Path, dict[str, Any]],
) -> None:
    root, record = trained
    names = sorted(p.name for p in (root / "ckpt").iterdir())
    assert names == ["step-000000002", "step-000000004", "step-000000006"]
    latest = root / "ckpt" / "step-000000006"
    meta = verify(latest)
    assert meta["layout"] == "sharded" and meta["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "extra.pt", "rng.pt"} <= set(meta["files"])
    assert record["last_saved"] == 6
    assert {c.format for c in Checkpointer(root / "ckpt").checkpoints()} == {"dcp"}
    assert len(record["stalls"]) == 3 and all(s is not None for s in record["stalls"])


def test_a_full_state_dict_of_an_fsdp_model_is_refused_with_a_fix(
    trained: tuple[Path, dict[str, Any]],
) -> None:
    message = trained[1]["refused"]
    assert "only rank 0's shard" in message and "layout='sharded'" in message


def test_one_rank_resumes_what_two_wrote_exactly(trained: tuple[Path, dict[str, Any]]) -> None:
    root, record = trained
    proc = torchrun(1, "resume", root / "ckpt", root / "resume1.pt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = load(root / "resume1.pt")
    assert resumed["world_size"] == 1 and resumed["resumed"] == 6
    assert resumed["extra"] == {"seen": 6}
    # the async snapshot was taken at step 6, although training went on while it was written
    assert_same(resumed["state"], record["saved"][6])


def test_an_unsharded_model_in_a_plain_process_loads_the_sharded_checkpoint(
    trained: tuple[Path, dict[str, Any]],
) -> None:
    root, record = trained
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))
    assert Checkpointer(root / "ckpt", keep=3).load_latest(model) == 6
    assert_same({k: v.detach() for k, v in model.state_dict().items()}, record["saved"][6])


def test_a_rank_killed_while_committing_leaves_the_previous_checkpoint(
    trained: tuple[Path, dict[str, Any]],
) -> None:
    root, record = trained
    ckpt = root / "ckpt"
    proc = torchrun(2, "crash", ckpt, root / "crash.pt")
    assert proc.returncode != 0
    assert load(root / "crash.pt")["resumed"] == 6
    names = sorted(p.name for p in ckpt.iterdir())
    leftovers = [n for n in names if n.startswith(".tmp-step-000000008")]
    assert leftovers and "step-000000008" not in names
    shards = {p.name for p in (ckpt / leftovers[0]).iterdir()}
    assert "__0_0.distcp" in shards and "meta.json" not in shards  # written, never committed
    proc = torchrun(1, "resume", ckpt, root / "after.pt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = load(root / "after.pt")
    assert after["resumed"] == 6
    assert_same(after["state"], record["saved"][6])
    assert not any(p.name.startswith(".tmp-") for p in ckpt.iterdir())
