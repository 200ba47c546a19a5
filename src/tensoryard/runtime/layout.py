"""Which checkpoint layout a model needs, and the torch.distributed.checkpoint (DCP) glue.

Two layouts:

- ``full``: one state dict written by rank 0 (``state.pt``). Right for a single process and
  for DDP, where every rank holds the same parameters.
- ``sharded``: every rank writes its own shards with DCP (``__<rank>_0.distcp`` plus DCP's
  ``.metadata``). Needed when parameters are sharded (FSDP2 ``fully_shard`` or tensor
  parallel, i.e. DTensor parameters; or FSDP1), and it can be resumed by a different number of
  ranks (DCP reshards on load).

`choose_layout` detects the layout from the model and refuses a request that would save
wrongly: a full state dict of a sharded model would hold rank 0's shard only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as tdist

from tensoryard.errors import RuntimeSetupError

__all__ = ["Layout", "LayoutChoice", "choose_layout", "detect_layout", "load_sharded"]

Layout = Literal["full", "sharded"]
LayoutChoice = Literal["auto", "full", "sharded"]
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = ("auto", "full", "sharded")


def _is_fsdp1(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return any(isinstance(module, FullyShardedDataParallel) for module in model.modules())


def _has_dtensor(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return any(isinstance(param, DTensor) for param in model.parameters())


def detect_layout(model: torch.nn.Module) -> Layout:
    """``sharded`` for FSDP1/FSDP2/tensor-parallel models, ``full`` otherwise."""
    return "sharded" if _is_fsdp1(model) or _has_dtensor(model) else "full"


def choose_layout(model: torch.nn.Module, requested: LayoutChoice) -> Layout:
    """The layout to save `model` with; RuntimeSetupError when `requested` would save wrongly."""
    if requested not in LAYOUT_CHOICES:
        raise RuntimeSetupError(
            f"checkpoint layout={requested!r} is not one of {', '.join(LAYOUT_CHOICES)} "
            "(fix: use 'auto', which picks 'sharded' for FSDP/DTensor models and 'full' otherwise)"
        )
    detected = detect_layout(model)
    if requested == "auto":
        return detected
    if requested == "full" and detected == "sharded":
        kind = "FSDP1" if _is_fsdp1(model) else "DTensor (FSDP2 / tensor parallel)"
        raise RuntimeSetupError(
            f"checkpoint layout='full' was requested for a model with {kind} parameters: a full "
            "state dict written by rank 0 would hold only rank 0's shard (or gather the whole "
            "model on one rank) (fix: use layout='sharded' or 'auto', which writes every "
            "rank's shards with torch.distributed.checkpoint)"
        )
    return requested


def sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """The DCP state of model (and optimizer): FQN keys, so any world size can load it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_sharded(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> None:
    """Load a DCP checkpoint into model/optimizer, resharding to this world size."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    state = sharded_state(model, optimizer)
    process_group = None if not tdist.is_initialized() else tdist.group.WORLD
    load(state, storage_reader=FileSystemReader(str(path)), process_group=process_group)
    if optimizer is None:
        set_model_state_dict(model, _as_mapping(state["model"]))
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=_as_mapping(state["model"]),
            optim_state_dict=_as_mapping(state["optim"]),
        )


def _as_mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RuntimeSetupError(f"unexpected DCP state {type(value).__name__} (expected a dict)")
    return dict(value)
