"""Evaluate a tiny GPT checkpoint: perplexity on held-out text.

    python evaluate.py --checkpoint RUN/checkpoints/step-000040 --text-file heldout.jsonl

The text is tokenized as training tokenizes it (UTF-8 bytes, 256 after each document; a
``.jsonl`` instruction set is formatted with data.INSTRUCTION_TEMPLATE) and cut into
non-overlapping windows of seq_len + 1 tokens; the loss is the mean next-token cross-entropy
over them and perplexity = exp(loss). The result goes to ``$TYARD_RUN_DIR/outputs.json``
(``{"perplexity", "loss", "tokens"}``), which a pipeline step exposes as its outputs
(docs/pipelines.md), and to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
from data import documents
from model import GPTConfig, TinyGPT

from tensoryard.data.tokenizer import BYTE_EOS_ID


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="a step-N directory")
    p.add_argument("--text-file", type=Path, action="append", required=True, help="repeatable")
    p.add_argument("--seq-len", type=int, default=128, help="as in training")
    p.add_argument("--d-model", type=int, default=128, help="as in training")
    p.add_argument("--layers", type=int, default=2, help="as in training")
    p.add_argument("--heads", type=int, default=4, help="as in training")
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    return p.parse_args(argv)


def tokens_of(files: list[Path]) -> torch.Tensor:
    ids: list[int] = []
    for path in files:
        for _, data in documents(path):
            ids.extend(data)
            ids.append(BYTE_EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def evaluate(model: TinyGPT, tokens: torch.Tensor, seq_len: int, batch_size: int) -> float:
    """Mean next-token loss over non-overlapping windows of seq_len + 1 tokens."""
    windows = tokens.numel() // (seq_len + 1)
    if windows == 0:
        raise ValueError(f"the text has {tokens.numel()} tokens; need at least {seq_len + 1}")
    batches = tokens[: windows * (seq_len + 1)].view(windows, seq_len + 1)
    total = 0.0
    for start in range(0, windows, batch_size):
        batch = batches[start : start + batch_size]
        total += float(model(batch[:, :-1], batch[:, 1:])) * batch.shape[0]
    return total / windows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = GPTConfig(
        seq_len=args.seq_len, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads
    )
    model = TinyGPT(config)
    file = args.checkpoint / "state.pt" if args.checkpoint.is_dir() else args.checkpoint
    try:
        model.load_state_dict(torch.load(file, map_location="cpu", weights_only=True)["model"])
        tokens = tokens_of(args.text_file)
        model.eval()
        loss = evaluate(model, tokens, args.seq_len, args.batch_size)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        print(f"error: cannot evaluate {file}: {exc}", file=sys.stderr, flush=True)
        return 2
    result = {"perplexity": math.exp(loss), "loss": loss, "tokens": int(tokens.numel())}
    out_dir = Path(os.environ.get("TYARD_RUN_DIR", "."))
    (out_dir / "outputs.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
