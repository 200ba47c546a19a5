"""Recognising a Megatron-LM command line: which arguments tell a Megatron job apart, and what
tensoryard reads from them (save and load directories, save interval, fine-tuning).

Pure parsing of the job's command, with no runtime behind it: the job spec validates with it
and :mod:`tensoryard.runtime.megatron` (resume arguments, checkpoint tracking) builds on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MEGATRON_ONLY_FLAGS", "MegatronArgs", "flag_values", "last_flag", "recognise"]

# Arguments of Megatron's parser (megatron/training/arguments.py) that no generic script has.
MEGATRON_ONLY_FLAGS = frozenset(
    {
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--context-parallel-size",
        "--expert-model-parallel-size",
        "--micro-batch-size",
        "--save-interval",
        "--use-mcore-models",
        "--use-dist-ckpt",
        "--ckpt-format",
        "--num-layers-per-virtual-pipeline-stage",
        "--sequence-parallel",
    }
)


@dataclass(frozen=True)
class MegatronArgs:
    """What tensoryard reads from a Megatron command line."""

    script: str
    save: str | None
    load: str | None
    save_interval: int | None
    finetune: bool


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value given to ``flag`` (``--flag V`` or ``--flag=V``), in order."""
    found = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            found.append(arg[len(flag) + 1 :])
    return found


def last_flag(argv: Sequence[str], flag: str) -> str | None:
    values = flag_values(argv, flag)
    return values[-1] if values else None  # argparse: the last occurrence wins


def recognise(command: Sequence[str], framework: str = "auto") -> MegatronArgs | None:
    """The Megatron arguments of a job's command, or None when it is not a Megatron job.

    ``framework``: ``megatron`` (always), ``none`` (never) or ``auto`` (at least two of the
    arguments only Megatron's parser has: a Megatron command line has several, another
    script none; one alone could be a script's own option of the same name)."""
    if framework == "none" or not command:
        return None
    script = command[0]
    args = command[1:]
    if framework != "megatron":
        flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
        if len(flags & MEGATRON_ONLY_FLAGS) < 2:
            return None
    interval = last_flag(args, "--save-interval")
    try:
        save_interval = int(interval) if interval is not None else None
    except ValueError:
        save_interval = None
    return MegatronArgs(
        script=script,
        save=last_flag(args, "--save"),
        load=last_flag(args, "--load"),
        save_interval=save_interval,
        finetune="--finetune" in args,
    )
