"""A minimal Megatron-style launch script: Megatron-LM's interface, a tiny model, CPU + gloo.

    torchrun --nproc-per-node 2 pretrain_gpt.py --tensor-model-parallel-size 1 \\
        --micro-batch-size 4 --train-iters 40 --save-interval 10 --save ckpt --load ckpt

Megatron-LM itself is impractical here: its training loop needs CUDA (initialize.py sets the
CUDA device of every rank, its optimizers and data iterators allocate on it) and Megatron-Core
is not on PyPI with the training loop. This script stands in for it in tensoryard's tests and
demos: it takes the same arguments (the ones tensoryard reads or passes, and the parallelism
and batch ones a real launch has), writes the same checkpoint layout and prints the same lines,
so the control plane meets it exactly as it meets ``pretrain_gpt.py`` of Megatron-LM:

- checkpoints: ``SAVE/iter_0000010/`` in the ``torch_dist`` format (a
  torch.distributed.checkpoint directory with ``.metadata`` and ``__R_0.distcp`` shards, plus
  ``common.pt`` and ``metadata.json``), then ``SAVE/latest_checkpointed_iteration.txt``,
  written by rank 0 after every rank finished (Megatron's commit marker);
- ``--load DIR`` resumes from DIR's tracker (model, optimizer, iteration), ``--finetune`` loads
  the weights only and starts at iteration 0, ``--no-load-optim`` skips the optimizer;
- ``--exit-signal-handler``: a SIGTERM makes every rank save a checkpoint at the end of the
  iteration and exit (the ranks agree through an all-reduce, as Megatron's handler does);
- progress: ``training_log``'s line every ``--log-interval`` iterations on the last rank, the
  ``save-checkpoint``/``load-checkpoint`` timers and the ``successfully saved/loaded`` lines.

Each iteration's batch is drawn from a generator seeded with (seed, iteration, rank), so a run
resumed from a checkpoint computes exactly the losses an uninterrupted run would.
Fault injection for tests: ``--fail-at-iteration N --fail-rank R`` (SIGKILL, on tensoryard's
attempt 1 only, so the restart runs through).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

TRACKER = "latest_checkpointed_iteration.txt"
VOCAB = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--seq-length", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--save", type=str, default=None)
    p.add_argument("--load", type=str, default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--ckpt-format", choices=["torch_dist"], default="torch_dist")
    p.add_argument("--finetune", action="store_true")
    p.add_argument("--no-load-optim", action="store_true")
    p.add_argument("--no-load-rng", action="store_true")
    p.add_argument("--exit-signal-handler", action="store_true")
    p.add_argument("--iteration-sleep", type=float, default=0.0, help="seconds per iteration")
    p.add_argument("--fail-at-iteration", type=int, default=None)
    p.add_argument("--fail-rank", type=int, default=0)
    args = p.parse_args(argv)
    if args.tensor_model_parallel_size != 1 or args.pipeline_model_parallel_size != 1:
        p.error("this stand-in runs data parallel only (tensor/pipeline parallel size 1)")
    return args


class TinyLM(nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.Sequential(
            *[nn.Sequential(nn.Linear(hidden, hidden), nn.GELU()) for _ in range(layers)]
        )
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def batch(args: argparse.Namespace, iteration: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable sequence task (next token = previous + 1 mod VOCAB, with noise), the same
    for a given (seed, iteration, rank) on every run."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration * 101 + rank)
    start = torch.randint(0, VOCAB, (args.micro_batch_size, 1), generator=g)
    seq = (start + torch.arange(args.seq_length + 1)) % VOCAB
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, VOCAB, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def print_rank_0(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, flush=True)


def print_rank_last(message: str) -> None:
    if dist.get_rank() == dist.get_world_size() - 1:
        print(message, flush=True)


def print_timer(name: str, seconds: float) -> None:
    t = torch.tensor([seconds * 1000.0, -seconds * 1000.0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lo, hi = -t[1].item(), t[0].item()
    print_rank_0("(min, max) time across ranks (ms):")
    print_rank_0(f"    {name} {'.' * (48 - len(name))}: ({lo:.2f}, {hi:.2f})")


def read_tracker(directory: Path) -> int | None:
    try:
        text = (directory / TRACKER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def save_checkpoint(
    args: argparse.Namespace, iteration: int, model: nn.Module, opt: torch.optim.Optimizer
) -> None:
    started = time.perf_counter()
    save = Path(args.save)
    where = save / f"iter_{iteration:07d}"
    print_rank_0(f"saving checkpoint at iteration {iteration:7d} to {save} in torch_dist format")
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(where))
    if dist.get_rank() == 0:
        torch.save({"iteration": iteration, "args": vars(args)}, where / "common.pt")
        (where / "metadata.json").write_text(
            json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1})
        )
    dist.barrier()
    if dist.get_rank() == 0:  # the commit: only now does the checkpoint exist for a loader
        tmp = save / f".{TRACKER}.tmp"
        tmp.write_text(str(iteration))
        os.replace(tmp, save / TRACKER)
    dist.barrier()
    print_rank_0(
        f"  successfully saved checkpoint from iteration {iteration:7d} to {save} [ t 1/1, p 1/1 ]"
    )
    print_timer("save-checkpoint", time.perf_counter() - started)


def load_checkpoint(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    if args.load is None:
        return 0
    load = Path(args.load)
    iteration = read_tracker(load)
    if iteration is None:
        print_rank_0(f"WARNING: could not find the metadata file {load / TRACKER}")
        print_rank_0("    will not load any checkpoints and will start from random")
        return 0
    started = time.perf_counter()
    print_rank_0(f" loading distributed checkpoint from {load} at iteration {iteration}")
    model_sd, optim_sd = get_state_dict(model, opt)
    state = (
        {"model": model_sd}
        if args.no_load_optim or args.finetune
        else {"model": model_sd, "optimizer": optim_sd}
    )
    dcp.load(state, checkpoint_id=str(load / f"iter_{iteration:07d}"))
    set_state_dict(
        model,
        opt,
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", optim_sd),
    )
    print_rank_0(
        f"  successfully loaded checkpoint from {load} [ t 1/1, p 1/1 ] at iteration {iteration}"
    )
    print_timer("load-checkpoint", time.perf_counter() - started)
    return 0 if args.finetune else iteration


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(TinyLM(args.hidden_size, args.num_layers))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    iteration = load_checkpoint(args, model, opt)
    received: list[int] = []
    if args.exit_signal_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    gbs = args.global_batch_size or args.micro_batch_size * world
    print_rank_0("training ...")
    total, count, interval_start = 0.0, 0, time.perf_counter()
    while iteration < args.train_iters:
        iteration += 1
        first_attempt = os.environ.get("TYARD_ATTEMPT", "1") == "1"
        if args.fail_at_iteration == iteration and rank == args.fail_rank and first_attempt:
            print(f"fault injection: killing rank {rank} at iteration {iteration}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        tokens, labels = batch(args, iteration, rank)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
        opt.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        total += reduced.item() / world
        count += 1
        if args.iteration_sleep:
            time.sleep(args.iteration_sleep)
        if iteration % args.log_interval == 0:
            elapsed = (time.perf_counter() - interval_start) / count
            now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            line = f" [{now}] iteration {iteration:8d}/{args.train_iters:8d} |"
            line += f" consumed samples: {iteration * gbs:12d} |"
            line += f" elapsed time per iteration (ms): {elapsed * 1000.0:.1f} |"
            line += f" learning rate: {args.lr:.6E} |"
            line += f" global batch size: {gbs:5d} |"
            line += f" lm loss: {total / count:.6E} |"
            line += " loss scale: 1.0 |"
            line += f" grad norm: {grad_norm:.3f} |"
            line += f" number of skipped iterations: {0:3d} |"
            line += f" number of nan iterations: {0:3d} |"
            print_rank_last(line)
            total, count, interval_start = 0.0, 0, time.perf_counter()
        stop = torch.tensor([1 if received else 0])
        if args.exit_signal_handler:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        due = bool(args.save_interval) and iteration % args.save_interval == 0
        if args.save and (due or stop.item()):
            save_checkpoint(args, iteration, model, opt)
        if stop.item():
            print_rank_0(f"exiting program after receiving SIGTERM at iteration {iteration}")
            break
    leave(0)
    return 0


def leave(code: int) -> None:
    """Exit without tearing the gloo process group down: torch 2.13's ~ProcessGroupGloo (run
    when DDP's Reducer is freed, at the latest when main() returns) joins its worker thread
    while holding the GIL, and that thread may still need the GIL to free the last
    collective's tensors (seen as a hang after the last iteration; py-spy --native)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
