"""Train a tiny byte-level GPT with DDP on the standard library's source code.

    torchrun --nproc-per-node 2 train.py --steps 240

The text is prepared once into a tensoryard dataset (see data.py; default directory
$TYARD_RUN_DIR/../data/tiny-gpt-stdlib, or --data-dir) and read with
tensoryard.data.build_torch_loader: seq_len + 1 token windows in a shuffled order keyed by the
seed, a global batch of batch_size x world_size, each rank its slice. Under tensoryard the
TYARD_* variables say where to checkpoint and report; alone it writes to ./.tyard/tiny-gpt-local.
Checkpoints hold the loader's position next to the model, optimizer and RNG states, so a resumed
attempt trains on exactly the samples an uninterrupted run would, and its losses match.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from data import Corpus, default_data_dir, ensure_dataset
from model import GPTConfig, TinyGPT
from torch.nn.parallel import DistributedDataParallel

from tensoryard.data import TorchTokenLoader, build_torch_loader
from tensoryard.errors import DataError, RuntimeSetupError, TensoryardError
from tensoryard.runtime import Session, session


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=240, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--d-model", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    p.add_argument("--seed", type=int, default=1234, help="seeds model init, data order, dropout")
    p.add_argument("--max-bytes", type=int, default=None, help="use only this much text")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the prepared dataset lives (default: $TYARD_RUN_DIR/../data/tiny-gpt-stdlib)",
    )
    p.add_argument(
        "--text-file",
        type=Path,
        action="append",
        default=None,
        help="train on this text file (or .jsonl instruction set) instead of the standard "
        "library; repeatable",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start a fresh run from this checkpoint's model weights (fine-tuning); a resumed "
        "run ignores it",
    )
    p.add_argument("--checkpoint-interval", type=int, default=None, help="default: from env")
    p.add_argument("--fail-at-step", type=int, default=None, help="fault injection: kill a rank")
    p.add_argument("--fail-rank", type=int, default=1, help="the rank --fail-at-step kills")
    return p.parse_args(argv)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Warmup then cosine decay to 10%: a pure function of the step, nothing to checkpoint."""
    peak, warmup = float(args.lr), int(args.warmup)
    if step <= warmup:
        return peak * step / max(1, warmup)
    progress = (step - warmup) / max(1, args.steps - warmup)
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def maybe_fail(args: argparse.Namespace, step: int, rank: int) -> None:
    """On attempt 1 only, SIGKILL `--fail-rank` at the start of `--fail-at-step`."""
    if (
        step == args.fail_at_step
        and rank == args.fail_rank
        and os.environ.get("TYARD_ATTEMPT", "1") == "1"
    ):
        print(f"fault injection: killing rank {rank} at step {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def local_env() -> Mapping[str, str]:
    """Outside tensoryard, keep runs and checkpoints under ./.tyard/tiny-gpt-local."""
    return {"TYARD_RUN_DIR": os.path.join(".tyard", "tiny-gpt-local"), **os.environ}


def build_loader(
    args: argparse.Namespace, sess: Session, env: Mapping[str, str]
) -> TorchTokenLoader:
    """Prepare the corpus (once per data directory) and open this rank's loader on it."""
    data_dir = args.data_dir or default_data_dir(env)
    if args.text_file:
        corpus = Corpus.from_files(args.text_file, max_bytes=args.max_bytes)
    else:
        corpus = Corpus.stdlib(max_bytes=args.max_bytes)
    dataset = ensure_dataset(corpus, data_dir, sess.dist)
    return build_torch_loader(
        dataset,
        seq_len=args.seq_len,
        global_batch=args.batch_size * sess.dist.world_size,
        rank=sess.dist.rank,
        world_size=sess.dist.world_size,
        seed=args.seed,
    )


def init_weights(model: torch.nn.Module, path: Path) -> None:
    """Load the model weights of a checkpoint (a ``step-N`` directory or its ``state.pt``);
    every rank loads the same file, so the replicas stay identical."""
    file = path / "state.pt" if path.is_dir() else path
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
    except FileNotFoundError as exc:
        raise RuntimeSetupError(f"--init-from {path}: no checkpoint there") from exc
    except (RuntimeError, KeyError, ValueError) as exc:
        raise RuntimeSetupError(
            f"--init-from {path} does not fit this model: {exc} (fix: use the same --d-model, "
            "--layers, --heads and --seq-len as the run that wrote it)"
        ) from exc
    logging.getLogger("tiny_gpt").info("initialised the model from %s", file)


def resume_loader(loader: TorchTokenLoader, sess: Session, start: int) -> None:
    """Put the loader where the checkpoint's step left it (a fresh run starts at 0)."""
    state = sess.checkpointer.loaded_extra.get("data")
    if state is not None:
        try:
            loader.load_state_dict(state)
        except DataError as exc:
            raise DataError(
                f"the checkpoint of step {start} in {sess.checkpointer.dir} was trained on other "
                f"data: {exc}"
            ) from exc
    elif start > 0:
        raise DataError(
            f"the checkpoint of step {start} in {sess.checkpointer.dir} holds no data-loader "
            "state, so the samples to resume with are unknown (fix: start with an empty "
            "TYARD_CHECKPOINT_DIR)"
        )


def train(args: argparse.Namespace, config: GPTConfig) -> None:
    env = local_env()
    with session(env=env, interval=args.checkpoint_interval) as sess:
        rank, device = sess.dist.rank, sess.dist.device
        torch.manual_seed(args.seed + rank)  # same init after DDP's broadcast; own dropout stream
        loader = build_loader(args, sess, env)
        model = TinyGPT(config).to(device)
        ddp = DistributedDataParallel(model) if sess.dist.is_distributed else model
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        start = sess.resume(model, optimizer)
        if start == 0 and args.init_from is not None:
            init_weights(model, args.init_from)
        resume_loader(loader, sess, start)
        batches: Iterator[torch.Tensor] = sess.batches(loader)  # timed: data-loader wait

        def extra() -> dict[str, Any]:
            # Read when a checkpoint is written: the samples handed out so far, nothing more.
            return {"data": loader.state_dict()}

        try:
            for step in sess.loop(args.steps, model, optimizer, extra=extra):
                maybe_fail(args, step, rank)
                lr = lr_at(step, args)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                batch = next(batches).to(device, non_blocking=True)  # (batch, seq_len + 1)
                loss = ddp(batch[:, :-1], batch[:, 1:])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                optimizer.step()
                tokens = args.batch_size * args.seq_len * sess.dist.world_size  # global batch
                sess.report(step, loss=sess.dist.mean(loss.item()), lr=lr, tokens=tokens)
        finally:
            loader.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank_tag = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank_tag}] %(message)s")
    config = GPTConfig(
        seq_len=args.seq_len,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        dropout=args.dropout,
    )
    try:
        train(args, config)
    except TensoryardError as exc:  # bad data dir, foreign checkpoint: a message, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
