"""ClusterSpec: the shape of a cluster (node groups, GPU model, switch topology).

Used by the simulator and by tests; production clusters report their nodes from the inventory.
A shape string is one or more groups joined by '+': ``64x8`` (64 nodes with 8 GPUs),
``32x8:H100+16x8:A100``, ``1x0`` (one CPU-only node). ``nodes_per_switch`` groups
consecutive nodes of a group under one leaf switch; ``switches_per_block`` groups switches
under one spine block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from tensoryard.errors import FieldIssue, SpecError
from tensoryard.spec._common import StrictModel, parse_memory_bytes, spec_error_from_validation

__all__ = [
    "ClusterSpec",
    "NodeGroupSpec",
    "NodeInfo",
    "parse_cluster_shape",
    "parse_cluster_spec",
]

Bytes = Annotated[int, BeforeValidator(parse_memory_bytes)]
_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([A-Za-z0-9][A-Za-z0-9._-]*))?\s*$")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of an expanded ClusterSpec (plain data; the scheduler has its own Node)."""

    name: str
    gpu_model: str | None
    gpus: int
    cpu: float
    memory: int
    switch: str
    block: str


class NodeGroupSpec(StrictModel):
    """`count` identical nodes."""

    name: str = Field("node", pattern=r"^[a-z][a-z0-9-]{0,30}$", description="Name prefix.")
    count: int = Field(..., ge=1, le=100_000, description="Number of nodes.")
    gpus_per_node: int = Field(8, ge=0, le=16, description="GPUs per node; 0 for CPU-only.")
    gpu_model: str | None = Field("H100", description="GPU model; ignored when gpus_per_node=0.")
    cpu: float = Field(64.0, gt=0, le=4096, description="CPU cores per node.")
    memory: Bytes = Field(0, ge=0, description="Memory per node like '1Ti'; 0: not tracked.")
    nodes_per_switch: int | None = Field(
        None, ge=1, description="Nodes under one leaf switch; omit for one switch per node."
    )
    switches_per_block: int | None = Field(
        None, ge=1, description="Leaf switches under one spine block; omit for one block."
    )


class ClusterSpec(StrictModel):
    """A cluster made of node groups."""

    groups: list[NodeGroupSpec] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _unique_group_names(self) -> ClusterSpec:
        names = [g.name for g in self.groups]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(
                    f"node group name {name!r} is used twice (fix: give each group its own name)"
                )
        return self

    def expand(self) -> list[NodeInfo]:
        """Every node, with switch and block names derived from the group layout."""
        out: list[NodeInfo] = []
        for group in self.groups:
            model = group.gpu_model if group.gpus_per_node > 0 else None
            width = max(3, len(str(group.count - 1)))
            for i in range(group.count):
                switch_no = i // group.nodes_per_switch if group.nodes_per_switch else i
                block_no = switch_no // group.switches_per_block if group.switches_per_block else 0
                out.append(
                    NodeInfo(
                        name=f"{group.name}-{i:0{width}d}",
                        gpu_model=model,
                        gpus=group.gpus_per_node,
                        cpu=group.cpu,
                        memory=group.memory,
                        switch=f"{group.name}-sw{switch_no:03d}",
                        block=f"{group.name}-blk{block_no:02d}",
                    )
                )
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)


def parse_cluster_shape(
    shape: str,
    *,
    nodes_per_switch: int | None = None,
    switches_per_block: int | None = None,
    gpu_model: str = "H100",
    cpu_per_node: float = 64.0,
) -> ClusterSpec:
    """Read ``64x8``, ``32x8:H100+16x8:A100`` or ``1x0`` into a ClusterSpec.

    Raises SpecError naming the accepted form when the shape cannot be read.
    """
    groups: list[dict[str, Any]] = []
    parts = shape.split("+") if shape.strip() else []
    if not parts:
        raise _shape_error(shape)
    for i, part in enumerate(parts):
        match = _SHAPE_RE.match(part)
        if match is None:
            raise _shape_error(shape)
        count, gpus, model = match.groups()
        groups.append(
            {
                "name": "node" if len(parts) == 1 else f"g{i}",
                "count": int(count),
                "gpus_per_node": int(gpus),
                "gpu_model": model or gpu_model,
                "cpu": cpu_per_node,
                "nodes_per_switch": nodes_per_switch,
                "switches_per_block": switches_per_block,
            }
        )
    return parse_cluster_spec({"groups": groups}, source=f"cluster shape {shape!r}")


def _shape_error(shape: str) -> SpecError:
    return SpecError(
        [
            FieldIssue(
                "cluster",
                f"cannot read cluster shape {shape!r}",
                "write NODESxGPUS like '64x8', optionally ':MODEL', groups joined by '+'",
            )
        ]
    )


def parse_cluster_spec(data: Any, *, source: str = "") -> ClusterSpec:
    """Validate a mapping into a ClusterSpec, or raise SpecError naming every bad field."""
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source) from exc
