"""Checkpointer: atomic saves, keep-k, exact resume (RNG included), corrupt fallback."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime.checkpoint import Checkpointer, CheckpointInfo


def make_model(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    x = torch.randn(4, 8)  # draws from the global RNG, like dropout does
    loss = (model(x) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.item())


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def step_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_save_then_load_latest_restores_model_optimizer_and_step(tmp_path: Path) -> None:
    model, opt = make_model(0)
    train_step(model, opt)
    info = Checkpointer(tmp_path, interval=1, keep=3).save(7, model, opt, {"tokens_seen": 700})
    assert isinstance(info, CheckpointInfo) and info.step == 7 and info.size_bytes > 0
    assert info.format == "state-dict"  # what the control plane records for it
    other, other_opt = make_model(1)
    ckpt = Checkpointer(tmp_path, interval=1, keep=3)
    assert ckpt.load_latest(other, other_opt) == 7
    assert ckpt.loaded_extra == {"tokens_seen": 700}
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_an_empty_directory_means_a_fresh_start(tmp_path: Path) -> None:
    model, opt = make_model()
    assert Checkpointer(tmp_path / "none", interval=5, keep=1).load_latest(model, opt) is None


def test_resuming_continues_with_exactly_the_same_losses(tmp_path: Path) -> None:
    torch.manual_seed(42)
    random.seed(42)
    np.random.seed(42)
    model, opt = make_model(0)
    ckpt = Checkpointer(tmp_path, interval=3, keep=2)
    losses = []
    for step in range(1, 7):
        losses.append(train_step(model, opt))
        if ckpt.should_save(step):
            ckpt.save(step, model, opt)
    assert step_dirs(tmp_path) == ["step-000000003", "step-000000006"]
    (tmp_path / "step-000000006").rename(tmp_path / "ignored")  # resume from step 3 instead
    resumed, resumed_opt = make_model(5)
    torch.manual_seed(999)  # the new process's RNG is elsewhere; the checkpoint puts it back
    start = Checkpointer(tmp_path, interval=3, keep=2).load_latest(resumed, resumed_opt)
    assert start == 3
    again = [train_step(resumed, resumed_opt) for _ in range(start + 1, 7)]
    assert again == losses[3:]


def test_every_rng_is_restored_to_the_saved_stream(tmp_path: Path) -> None:
    model, opt = make_model()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    Checkpointer(tmp_path, interval=1, keep=1).save(1, model, opt)
    expected = draws()
    random.seed(10)
    np.random.seed(20)
    torch.manual_seed(30)
    Checkpointer(tmp_path, interval=1, keep=1).load_latest(model, opt)
    assert draws() == expected


def test_only_the_last_k_checkpoints_are_kept(tmp_path: Path) -> None:
    model, opt = make_model()
    ckpt = Checkpointer(tmp_path, interval=1, keep=2)
    for step in (10, 20, 30, 40):
        ckpt.save(step, model, opt)
    assert step_dirs(tmp_path) == ["step-000000030", "step-000000040"]
    assert [c.step for c in ckpt.checkpoints()] == [40, 30]


def test_keep_zero_leaves_every_checkpoint_to_the_control_planes_retention(
    tmp_path: Path,
) -> None:
    model, opt = make_model()
    ckpt = Checkpointer(env={"TYARD_CHECKPOINT_DIR": str(tmp_path), "TYARD_CHECKPOINT_KEEP": "0"})
    for step in (10, 20, 30, 40):
        ckpt.save(step, model, opt)
    assert ckpt.keep == 0
    assert step_dirs(tmp_path) == [f"step-0000000{s}" for s in (10, 20, 30, 40)]
    assert ckpt.load_latest(model, opt) == 40


@pytest.mark.parametrize(
    ("interval", "step", "expected"),
    [(5, 5, True), (5, 10, True), (5, 4, False), (5, 0, False), (1, 1, True)],
    ids=[
        "the interval step is saved",
        "a multiple of the interval is saved",
        "a step between intervals is not saved",
        "step zero is never saved",
        "interval one saves every step",
    ],
)
def test_should_save_follows_the_interval(interval: int, step: int, expected: bool) -> None:
    assert Checkpointer("/unused", interval=interval, keep=1).should_save(step) is expected


def test_an_exception_mid_save_leaves_the_previous_checkpoint_as_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make_model()
    ckpt = Checkpointer(tmp_path, interval=1, keep=3)
    ckpt.save(1, model, opt)
    calls = []

    def failing_write(path: Path, data: bytes) -> None:
        calls.append(path.name)
        path.write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tensoryard.runtime.checkpoint._write_file", failing_write)
    with pytest.raises(RuntimeSetupError, match="could not write the checkpoint of step 2"):
        ckpt.save(2, model, opt)
    assert calls == ["state.pt"]
    assert step_dirs(tmp_path) == ["step-000000001"]  # the temporary directory is gone too
    monkeypatch.undo()
    assert Checkpointer(tmp_path, interval=1, keep=3).load_latest(model, opt) == 1


CRASHING_SAVER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from tensoryard.runtime import checkpoint
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = checkpoint.Checkpointer(sys.argv[1], interval=1, keep=3)
    ckpt.save(1, model, opt)
    def crash(path, data):
        with open(path, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint._write_file = crash
    ckpt.save(2, model, opt)
    """
)


@pytest.mark.slow  # a real process (imports torch: seconds on a busy machine)
def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_as_latest(
    tmp_path: Path,
) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASHING_SAVER, str(tmp_path)], check=False)
    assert proc.returncode == -9
    leftovers = step_dirs(tmp_path)
    assert "step-000000001" in leftovers and any(n.startswith(".tmp-") for n in leftovers)
    model, opt = torch.nn.Linear(64, 64), None
    assert Checkpointer(tmp_path, interval=1, keep=3).load_latest(model, opt) == 1
    assert step_dirs(tmp_path) == ["step-000000001"]  # the crashed save was cleaned up


def corrupt_state(path: Path) -> None:
    data = bytearray((path / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "state.pt").write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        corrupt_state,
        lambda p: (p / "meta.json").write_text("{not json"),
        lambda p: (p / "rng.pt").unlink(),
        lambda p: (p / "state.pt").write_bytes(b""),
    ],
    ids=[
        "a flipped byte in the model state",
        "an unreadable meta.json",
        "a missing RNG file",
        "a truncated model state",
    ],
)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, damage: object
) -> None:
    model, opt = make_model()
    Checkpointer(tmp_path, interval=1, keep=3).save(1, model, opt)
    Checkpointer(tmp_path, interval=1, keep=3).save(2, model, opt)
    assert callable(damage)
    damage(tmp_path / "step-000000002")
    events: list[str] = []
    ckpt = Checkpointer(tmp_path, interval=1, keep=3, on_event=events.append)
    assert ckpt.load_latest(model, opt) == 1
    assert any(str(tmp_path / "step-000000002") in e and "corrupt" in e for e in events)


def test_only_corrupt_checkpoints_raise_an_error_naming_them(tmp_path: Path) -> None:
    model, opt = make_model()
    Checkpointer(tmp_path, interval=1, keep=3).save(1, model, opt)
    corrupt_state(tmp_path / "step-000000001")
    with pytest.raises(RuntimeSetupError, match=r"step-000000001.*fix: delete them"):
        Checkpointer(tmp_path, interval=1, keep=3).load_latest(model, opt)


def test_a_checkpoint_of_another_model_is_refused_with_a_fix(tmp_path: Path) -> None:
    model, opt = make_model()
    Checkpointer(tmp_path, interval=1, keep=3).save(1, model, opt)
    other = nn.Linear(3, 3)
    with pytest.raises(RuntimeSetupError, match="does not fit this model"):
        Checkpointer(tmp_path, interval=1, keep=3).load_latest(other, None)


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    model, opt = make_model()
    ckpt = Checkpointer(tmp_path, interval=1, keep=3)
    ckpt.save(5, model, opt, {"version": 1})
    ckpt.save(5, model, opt, {"version": 2})
    assert step_dirs(tmp_path) == ["step-000000005"]
    ckpt.load_latest(model, opt)
    assert ckpt.loaded_extra == {"version": 2}


def test_the_saved_callback_receives_every_checkpoint(tmp_path: Path) -> None:
    model, opt = make_model()
    seen: list[CheckpointInfo] = []
    ckpt = Checkpointer(tmp_path, interval=1, keep=3, on_saved=seen.append)
    ckpt.save(1, model, opt)
    ckpt.save(2, model, opt)
    assert [(c.step, c.path.name) for c in seen] == [(1, "step-000000001"), (2, "step-000000002")]


def test_an_unwritable_directory_raises_a_setup_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model, opt = make_model()
    with pytest.raises(RuntimeSetupError, match="check free space and permissions"):
        Checkpointer(blocker / "ckpt", interval=1, keep=1).save(1, model, opt)


def test_defaults_come_from_the_contract_environment(tmp_path: Path) -> None:
    env = {
        "TYARD_CHECKPOINT_DIR": str(tmp_path / "c"),
        "TYARD_CHECKPOINT_INTERVAL": "7",
        "TYARD_CHECKPOINT_KEEP": "4",
    }
    ckpt = Checkpointer(env=env)
    assert (ckpt.dir, ckpt.interval, ckpt.keep) == (tmp_path / "c", 7, 4)
    assert Checkpointer(env={"TYARD_RUN_DIR": str(tmp_path)}).dir == tmp_path / "checkpoints"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TYARD_CHECKPOINT_DIR": "/x", "TYARD_CHECKPOINT_INTERVAL": "often"}, "INTERVAL"),
        ({"TYARD_CHECKPOINT_DIR": "/x", "TYARD_CHECKPOINT_KEEP": "-1"}, "TYARD_CHECKPOINT_KEEP"),
        ({}, "TYARD_CHECKPOINT_DIR"),
    ],
    ids=[
        "a non-numeric interval names the variable",
        "keeping a negative number of checkpoints names the variable",
        "no directory at all says how to set one",
    ],
)
def test_bad_environment_raises_a_setup_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeSetupError, match=message):
        Checkpointer(env=env)
