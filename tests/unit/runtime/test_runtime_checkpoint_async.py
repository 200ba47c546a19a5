"""Checkpointer with async_save (full layout, one process): the snapshot is frozen at save
time, at most one save is in flight, a background failure is raised on the next collective,
and the layout choice is validated."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime import checkpoint
from tensoryard.runtime.checkpoint import Checkpointer, CheckpointInfo
from tensoryard.runtime.layout import choose_layout, detect_layout


def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = (model(torch.randn(4, 8)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def slow_writes(monkeypatch: pytest.MonkeyPatch, gate: threading.Event) -> None:
    real = checkpoint._write_file

    def gated(path: Path, data: bytes) -> None:
        gate.wait(timeout=30)
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", gated)


def test_an_async_save_keeps_the_state_of_its_step_while_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make_model()
    train_step(model, opt)
    saved: list[CheckpointInfo] = []
    ckpt = Checkpointer(tmp_path, interval=1, async_save=True, on_saved=saved.append)
    gate = threading.Event()
    slow_writes(monkeypatch, gate)
    at_save = snapshot(model)
    assert ckpt.save(1, model, opt) is None
    assert ckpt.in_flight and ckpt.last_stall_s is not None
    for _ in range(3):  # the optimizer changes the parameters in place meanwhile
        train_step(model, opt)
    assert not torch.equal(model[0].weight, at_save["0.weight"])
    assert saved == [] and ckpt.last_saved_step is None  # not committed yet
    gate.set()
    ckpt.wait()
    assert [i.step for i in saved] == [1] and ckpt.last_saved_step == 1
    assert ckpt.last_save_s is not None and ckpt.last_save_s >= ckpt.last_stall_s
    fresh, fresh_opt = make_model()
    assert Checkpointer(tmp_path).load_latest(fresh, fresh_opt) == 1
    for key, value in snapshot(fresh).items():
        assert torch.equal(value, at_save[key]), key


def test_a_second_save_waits_for_the_one_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make_model()
    order: list[str] = []
    ckpt = Checkpointer(
        tmp_path, async_save=True, on_saved=lambda info: order.append(f"saved {info.step}")
    )
    gate = threading.Event()
    slow_writes(monkeypatch, gate)
    ckpt.save(1, model, opt)
    threading.Timer(0.3, lambda: (order.append("released"), gate.set())).start()
    started = time.perf_counter()
    ckpt.save(2, model, opt)
    assert time.perf_counter() - started >= 0.25  # it blocked until save 1 was written
    assert order == ["released", "saved 1"]
    ckpt.wait()
    assert order == ["released", "saved 1", "saved 2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001", "step-000000002"]


def test_poll_reports_a_committed_background_save_without_blocking(tmp_path: Path) -> None:
    model, opt = make_model()
    saved: list[int] = []
    ckpt = Checkpointer(tmp_path, async_save=True, on_saved=lambda i: saved.append(i.step))
    ckpt.save(3, model, opt)
    deadline = time.monotonic() + 30
    while not saved and time.monotonic() < deadline:
        ckpt.poll()
        time.sleep(0.01)
    assert saved == [3]
    ckpt.wait()
    assert saved == [3]  # delivered once


def test_a_failed_background_save_is_raised_by_the_next_wait_and_leaves_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = make_model()
    ckpt = Checkpointer(tmp_path, interval=1, async_save=True)
    ckpt.save(1, model, opt)
    ckpt.wait()

    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_file", full_disk)
    assert ckpt.save(2, model, opt) is None
    with pytest.raises(RuntimeSetupError, match=r"checkpoint of step 2.*No space left"):
        ckpt.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001"]
    assert ckpt.last_saved_step == 1


def test_a_plain_model_gets_the_full_layout() -> None:
    model, _ = make_model()
    assert detect_layout(model) == "full"
    assert choose_layout(model, "auto") == "full"
    assert choose_layout(model, "sharded") == "sharded"


def test_an_unknown_layout_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(RuntimeSetupError, match=r"layout='zip'.*auto, full, sharded"):
        Checkpointer(tmp_path, layout="zip")  # type: ignore[arg-type]
    with pytest.raises(RuntimeSetupError, match="TYARD_CHECKPOINT_LAYOUT='zip'"):
        Checkpointer(tmp_path, env={"TYARD_CHECKPOINT_LAYOUT": "zip"})


def test_async_and_layout_come_from_the_environment(tmp_path: Path) -> None:
    env = {"TYARD_CHECKPOINT_ASYNC": "1", "TYARD_CHECKPOINT_LAYOUT": "full"}
    ckpt = Checkpointer(tmp_path, env=env)
    assert ckpt.async_save is True and ckpt.layout == "full"
    assert Checkpointer(tmp_path, env={}).async_save is False


def test_reused_snapshot_buffers_never_change_a_checkpoint_already_written(
    tmp_path: Path,
) -> None:
    model, opt = make_model()
    train_step(model, opt)
    ckpt = Checkpointer(tmp_path, keep=5, async_save=True)
    first = snapshot(model)
    ckpt.save(1, model, opt)
    train_step(model, opt)
    second = snapshot(model)
    ckpt.save(2, model, opt)  # waits for save 1, then copies into the same buffers
    ckpt.wait()
    for step, expected in ((1, first), (2, second)):
        state = torch.load(tmp_path / f"step-{step:09d}" / "state.pt", weights_only=True)
        for key, value in expected.items():
            assert torch.equal(state["model"][key], value), (step, key)


def test_the_sharded_stager_reuses_its_cpu_copy_until_the_layout_changes() -> None:
    from tensoryard.runtime.checkpoint import _ReusedStager

    stager = _ReusedStager(pin=False)
    state = {"model": {"w": torch.ones(4)}, "step": 1}
    first = stager.stage(state)
    buffer = first["model"]["w"]
    state["model"]["w"].add_(1)  # training goes on: the snapshot must not move
    assert torch.equal(first["model"]["w"], torch.ones(4))
    second = stager.stage(state)  # the next save (the previous one has finished writing)
    assert second["model"]["w"] is buffer and torch.equal(buffer, torch.full((4,), 2.0))
    # the optimizer's state appears after its first step: a new layout, a new copy
    state["optim"] = {"exp_avg": torch.zeros(4)}
    third = stager.stage(state)
    assert "optim" in third and torch.equal(third["optim"]["exp_avg"], torch.zeros(4))
    state["model"]["w"] = torch.ones(8)  # resized
    assert stager.stage(state)["model"]["w"].shape == (8,)
