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

With ``--use-mcore-models`` (Megatron-LM's flag for Megatron-Core models) the model and the
checkpoints are Megatron-Core's own (``pip install megatron-core``; it needs CUDA, so NCCL on
GPUs): ``GPTModel`` with the local layer spec (no Transformer Engine), Megatron-Core's parallel
state (``--tensor-model-parallel-size`` > 1 works; pipeline stays 1), its CUDA RNG tracker, and
``megatron.core.dist_checkpointing`` writing and reading the ``torch_dist`` directory, with the
optimizer state sharded like the model's (``optim_state_to_sharding_state``, as Megatron's
FP32Optimizer does). Only the training loop around it is this script's (Megatron-LM's
``megatron/training`` is not on PyPI).

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
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

TRACKER = "latest_checkpointed_iteration.txt"
VOCAB = 64
DEVICE = torch.device("cpu")
"""Where collectives' tensors live: the CPU for gloo, the rank's GPU for NCCL."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--use-mcore-models", action="store_true", help="Megatron-Core's GPTModel")
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
    if args.pipeline_model_parallel_size != 1:
        p.error("--pipeline-model-parallel-size: this script runs pipeline parallel size 1 only")
    if args.tensor_model_parallel_size != 1 and not args.use_mcore_models:
        p.error(
            "--tensor-model-parallel-size: the tiny model runs data parallel only; "
            "add --use-mcore-models for Megatron-Core's tensor parallelism"
        )
    if args.use_mcore_models and not torch.cuda.is_available():
        p.error("--use-mcore-models: Megatron-Core's attention allocates on CUDA; no GPU here")
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
    t = torch.tensor([seconds * 1000.0, -seconds * 1000.0], dtype=torch.float64, device=DEVICE)
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
    if args.use_mcore_models:
        mcore_save(args, where, iteration, model, opt)
    else:
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
    where = load / f"iter_{iteration:07d}"
    with_optim = not (args.no_load_optim or args.finetune)
    if args.use_mcore_models:
        mcore_load(where, model, opt, with_optim=with_optim)
    else:
        model_sd, optim_sd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": model_sd}
        if with_optim:
            state["optimizer"] = optim_sd
        dcp.load(state, checkpoint_id=str(where))
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


# --- Megatron-Core (--use-mcore-models) ------------------------------------------------------


def mcore_model(args: argparse.Namespace) -> tuple[nn.Module, int]:
    """Megatron-Core's GPTModel (local layer spec) under its parallel state, wrapped in DDP over
    the data-parallel group; returns (model, data-parallel rank). NCCL on the rank's GPU."""
    global DEVICE
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    DEVICE = torch.device(torch.cuda.current_device())
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=1,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    config = TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,  # no dropout: a resumed run computes the losses of an
        attention_dropout=0.0,  # uninterrupted one without the RNG states in the checkpoint
    )
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=args.seq_length,
    )
    gpt.to(DEVICE)  # as Megatron-LM does: the torch LayerNorm fallback is built on the CPU
    model = DistributedDataParallel(gpt, process_group=parallel_state.get_data_parallel_group())
    return model, parallel_state.get_data_parallel_rank()


def mcore_loss(
    args: argparse.Namespace, model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The mean of GPTModel's per-token (vocab-parallel) cross entropy, causal attention."""
    tokens, labels = tokens.to(DEVICE), labels.to(DEVICE)
    positions = torch.arange(args.seq_length, device=DEVICE).unsqueeze(0).expand_as(tokens)
    causal = torch.ones(args.seq_length, args.seq_length, dtype=torch.bool, device=DEVICE)
    mask = causal.tril().logical_not().view(1, 1, args.seq_length, args.seq_length)
    loss: torch.Tensor = model(tokens, positions, mask, labels=labels).float().mean()
    return loss


def mcore_sharded(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and the optimizer's sharded state dicts, as Megatron's FP32Optimizer builds
    them: Adam's moments sharded like their parameters; the step count goes to common.pt."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    gpt: Any = model.module
    model_sd = gpt.sharded_state_dict(prefix="")
    params = [p for group in opt.param_groups for p in group["params"]]
    optim_sd = opt.state_dict()
    steps = [float(state["step"]) for state in optim_sd["state"].values() if "step" in state]
    optim_state_to_sharding_state(
        optim_sd, get_param_id_to_sharded_param_map(model_sd, params), exclude_keys=("step",)
    )
    return {"model": model_sd, "optimizer": optim_sd, "optimizer_step": max(steps, default=0.0)}


def mcore_save(
    args: argparse.Namespace,
    where: Path,
    iteration: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
) -> None:
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        where.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = mcore_sharded(model, opt) | {"iteration": iteration, "args": vars(args)}
    dist_checkpointing.save(state, str(where))  # torch_dist: .metadata, *.distcp, common.pt


def mcore_load(
    where: Path, model: nn.Module, opt: torch.optim.Optimizer, *, with_optim: bool
) -> None:
    from megatron.core import dist_checkpointing

    if with_optim:  # Adam's state must exist to describe what to load (its init_state_fn)
        for group in opt.param_groups:
            for p in group["params"]:
                if not opt.state[p]:
                    opt.state[p].update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    template = mcore_sharded(model, opt)
    if not with_optim:
        template.pop("optimizer")
    loaded = dist_checkpointing.load(template, str(where))
    gpt: Any = model.module
    gpt.load_state_dict(loaded["model"])
    if with_optim:
        optim_sd = loaded["optimizer"]
        for state in optim_sd["state"].values():
            state["step"] = torch.tensor(float(loaded["optimizer_step"]))
        opt.load_state_dict(optim_sd)


def main() -> int:
    args = parse_args()
    torch.manual_seed(args.seed)
    if args.use_mcore_models:
        model, dp_rank = mcore_model(args)
    else:
        dist.init_process_group("gloo")
        model, dp_rank = (
            DistributedDataParallel(TinyLM(args.hidden_size, args.num_layers)),
            dist.get_rank(),
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    iteration = load_checkpoint(args, model, opt)
    received: list[int] = []
    if args.exit_signal_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    data_parallel = world // args.tensor_model_parallel_size
    gbs = args.global_batch_size or args.micro_batch_size * data_parallel
    print_rank_0("training ...")
    total, count, interval_start = 0.0, 0, time.perf_counter()
    while iteration < args.train_iters:
        iteration += 1
        first_attempt = os.environ.get("TYARD_ATTEMPT", "1") == "1"
        if args.fail_at_iteration == iteration and rank == args.fail_rank and first_attempt:
            print(f"fault injection: killing rank {rank} at iteration {iteration}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        tokens, labels = batch(args, iteration, dp_rank)  # tensor-parallel peers: same data
        if args.use_mcore_models:
            loss = mcore_loss(args, model, tokens, labels)
        else:
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
        stop = torch.tensor([1 if received else 0], device=DEVICE)
        if args.exit_signal_handler:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        due = bool(args.save_interval) and iteration % args.save_interval == 0
        if args.save and (due or stop.item()):
            save_checkpoint(args, iteration, model, opt)
        if stop.item():
            print_rank_0(f"exiting program after receiving SIGTERM at iteration {iteration}")
            break
    if args.use_mcore_models:  # a normal exit: Megatron-Core's writer started a Manager process
        dist.destroy_process_group()  # that only its exit handlers stop (os._exit would orphan it)
        return 0
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
