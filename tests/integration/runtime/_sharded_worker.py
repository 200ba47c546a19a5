"""A torchrun worker for test_runtime_sharded_checkpoint: an FSDP2 model on gloo (CPU).

    _sharded_worker.py train   CKPT OUT   train 7 steps, async sharded save every 2 steps
    _sharded_worker.py resume  CKPT OUT   load the latest checkpoint, record its state
    _sharded_worker.py crash   CKPT OUT   resume, train 2 steps, get killed committing the save

OUT (written by rank 0) is a torch file of what the test checks: the full model state at every
saved step, the resumed step and state, and whether layout="full" was refused.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from tensoryard.errors import RuntimeSetupError
from tensoryard.runtime import checkpoint
from tensoryard.runtime.dist import init, shutdown


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, generator=generator)
    loss = (model(x) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}


def main() -> None:
    phase, ckpt_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    dist = init(device="cpu")
    model, optimizer = build()
    record: dict[str, Any] = {"world_size": dist.world_size}
    ckpt = checkpoint.Checkpointer(ckpt_dir, interval=2, keep=3, async_save=True, dist=dist)
    if phase == "train":
        try:
            checkpoint.Checkpointer(ckpt_dir, layout="full", dist=dist).save(0, model, optimizer)
        except RuntimeSetupError as exc:
            record["refused"] = str(exc)
        saved: dict[int, dict[str, torch.Tensor]] = {}
        stalls = []
        for n in range(1, 8):  # step 7 runs while the save of step 6 is in flight
            step(model, optimizer, n)
            if ckpt.should_save(n):
                saved[n] = full_state(model)
                ckpt.save(n, model, optimizer, extra={"seen": n})
                stalls.append(ckpt.last_stall_s)
                # keep training while the save is in flight: the snapshot must not move
        ckpt.wait()
        record.update(saved=saved, stalls=stalls, last_saved=ckpt.last_saved_step)
    else:
        resumed = ckpt.load_latest(model, optimizer)
        record.update(resumed=resumed, state=full_state(model), extra=ckpt.loaded_extra)
        if phase == "crash":
            assert resumed is not None
            for n in (resumed + 1, resumed + 2):
                step(model, optimizer, n)

            def killed_while_committing(path: Path, data: bytes) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            checkpoint._write_file = killed_while_committing
            if dist.is_main:
                torch.save(record, out)
            ckpt.save(resumed + 2, model, optimizer)
            ckpt.wait()
    if dist.is_main:
        torch.save(record, out)
    shutdown()


if __name__ == "__main__":
    main()
