"""Hugging Face layout for the example tiny GPT: safetensors weights, config, byte tokenizer.

Export turns a tensoryard checkpoint (``state.pt`` holding ``{"model": state_dict}``, or a
plain state-dict ``.pt``) into::

    model.safetensors        the weights (names as in examples/tiny_gpt/model.py)
    config.json              shape of the model (inferred from the weights; heads given)
    tokenizer.json           a byte-level tokenizer: byte b is token b, 256 ends a document
    tokenizer_config.json    its settings (AutoTokenizer reads it)

and import accepts a directory holding at least the first three. torch, safetensors and
tokenizers are imported only here, when asked for.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from tensoryard.errors import DataError, FieldIssue, SpecError

__all__ = ["HF_FILES", "check_hf_layout", "export_hf", "tiny_gpt_config"]

HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")
MODEL_TYPE = "tensoryard-tiny-gpt"
EOD_TOKEN = "<|endofdoc|>"
BYTE_VOCAB = 256
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def check_hf_layout(path: Path) -> None:
    """SpecError naming every missing file unless ``path`` is a Hugging Face model directory."""
    if not path.is_dir():
        raise SpecError(
            [FieldIssue("path", f"{path} is not a directory", "pass the exported model directory")]
        )
    issues = []
    if not (path / "config.json").is_file():
        issues.append(FieldIssue("config.json", "missing", "export the model with its config"))
    if not any(path.glob("*.safetensors")):
        issues.append(
            FieldIssue("model.safetensors", "no *.safetensors file", "save weights as safetensors")
        )
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        issues.append(FieldIssue("tokenizer.json", "missing", "save the tokenizer with the model"))
    if issues:
        raise SpecError(issues, source=str(path))


def tiny_gpt_config(state: dict[str, Any], *, n_heads: int) -> dict[str, Any]:
    """config.json of the tiny GPT whose weights are ``state`` (shapes say all but heads)."""
    try:
        vocab, d_model = (int(n) for n in state["tokens.weight"].shape)
        seq_len = int(state["positions.weight"].shape[0])
    except KeyError as exc:
        raise SpecError(
            [
                FieldIssue(
                    "checkpoint",
                    f"no {exc.args[0]} tensor: not the example tiny GPT",
                    "export tiny GPT checkpoints only, or push the files as they are",
                )
            ]
        ) from exc
    layers = {int(m.group(1)) for k in state if (m := _BLOCK.match(k))}
    if d_model % n_heads:
        raise SpecError(
            [FieldIssue("n_heads", f"{n_heads} does not divide d_model={d_model}", "pass --heads")]
        )
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["TinyGPT"],
        "vocab_size": vocab,
        "seq_len": seq_len,
        "d_model": d_model,
        "n_layers": len(layers),
        "n_heads": n_heads,
        "tie_word_embeddings": True,
        "eos_token_id": BYTE_VOCAB,
        "torch_dtype": str(state["tokens.weight"].dtype).removeprefix("torch."),
    }


def export_hf(source: Path, dest: Path, *, n_heads: int = 4) -> Path:
    """Write the Hugging Face layout of the checkpoint (or HF directory) at ``source``."""
    _require("torch", "safetensors", "tokenizers")
    dest.mkdir(parents=True, exist_ok=True)
    if source.is_dir() and (source / "config.json").is_file():
        check_hf_layout(source)
        shutil.copytree(source, dest, dirs_exist_ok=True)
        return dest
    state = _load_state_dict(source)
    from safetensors.torch import save_file

    config = tiny_gpt_config(state, n_heads=n_heads)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(dest)
    return dest


def _require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise DataError(
            f"exporting to the Hugging Face layout needs {', '.join(missing)} "
            "(fix: pip install 'tensoryard[train,data]')"
        )


def _load_state_dict(source: Path) -> dict[str, Any]:
    import torch

    if source.is_dir():
        candidates = [source / "state.pt", *sorted(source.glob("*.pt")), *source.glob("*.pth")]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise SpecError(
                [
                    FieldIssue(
                        "checkpoint", f"no state.pt or *.pt in {source}", "export a checkpoint"
                    )
                ]
            )
        source = found[0]
    obj = torch.load(source, map_location="cpu", weights_only=True)
    state = obj.get("model", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecError(
            [
                FieldIssue(
                    "checkpoint",
                    f"{source} holds no model state dict",
                    "save {'model': model.state_dict()} or a plain state dict",
                )
            ]
        )
    return {k.removeprefix("module."): v for k, v in state.items()}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte (what the ByteLevel pre-tokenizer emits)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _write_tokenizer(dest: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOD_TOKEN, special=True)])
    tok.save(str(dest / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOD_TOKEN,
        "model_max_length": 1_000_000,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
