"""The cluster inventory: GPU nodes, their fabric and switches, the software stack, team quotas.

One YAML file, validated once here (the generators trust the typed object)::

    cluster:
      name: lab
      namespace: ml                       # LocalQueues live here
      software: {driver: "570.133.20", cuda: "12.8", pytorch: "2.7", nccl: "2.26.2"}
      driver_preinstalled: false          # true: the nodes' OS image ships the driver
      mig_strategy: none                  # none | single | mixed
    nodes:
      - name: gpu-a01
        gpu: {model: H100, count: 8, interconnect: nvswitch}   # none | nvlink | nvswitch
        ib: {hcas: [mlx5_0, mlx5_1], rails: 2, rate_gbps: 400}
        rack: r01
        leaf: leaf-01
        spine: spine-a
        cpu: 224
        memory: 2Ti
        nvme: 30Ti
    quotas:                                # the platform's quota file format (spec.queue)
      queues: [{name: nlp, cohort: research, nominal: {H100: 8}}]
      cohorts: [{name: research}]

Errors name the field (``nodes.3.name``) and the fix; every problem is reported at once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError

from tensoryard.cluster.compat import GPU_MODELS, SoftwareStack, check_stack
from tensoryard.errors import ConfigError, FieldIssue, SpecError
from tensoryard.spec._common import (
    StrictModel,
    load_yaml_text,
    parse_memory_bytes,
    read_spec_file,
    spec_error_from_validation,
)
from tensoryard.spec.queue import QuotaConfig, parse_quota_config

__all__ = [
    "ClusterSettings",
    "GpuSpec",
    "IbSpec",
    "Inventory",
    "NodeSpec",
    "PriorityClassSpec",
    "SoftwareSpec",
    "load_inventory",
    "parse_inventory",
]

Bytes = Annotated[int, BeforeValidator(parse_memory_bytes)]
_DNS_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"


class SoftwareSpec(StrictModel):
    """Versions installed cluster-wide (checked against tensoryard.cluster.compat)."""

    driver: str = Field(..., description="NVIDIA driver, like '570.133.20'.")
    cuda: str = Field(..., description="CUDA the training images are built with, like '12.8'.")
    pytorch: str = Field(..., description="PyTorch release of the training images, like '2.7'.")
    nccl: str = Field(..., description="NCCL the jobs load, like '2.26.2'.")


class PriorityClassSpec(StrictModel):
    """One WorkloadPriorityClass."""

    name: str = Field(..., pattern=_DNS_NAME, max_length=63)
    value: int = Field(..., ge=-(2**31), le=2**31 - 1)
    description: str = ""


def _default_priorities() -> list[PriorityClassSpec]:
    return [
        PriorityClassSpec(name="low", value=100, description="Preemptible background work."),
        PriorityClassSpec(name="normal", value=500, description="Default training jobs."),
        PriorityClassSpec(name="high", value=1000, description="Deadlines; may preempt."),
    ]


class ClusterSettings(StrictModel):
    """Cluster-wide settings."""

    name: str = Field(..., pattern=_DNS_NAME, max_length=40, description="Cluster name.")
    namespace: str = Field(
        "tensoryard", pattern=_DNS_NAME, max_length=63, description="Namespace of LocalQueues."
    )
    software: SoftwareSpec
    driver_preinstalled: bool = Field(
        False, description="True when the node image ships the driver (the operator skips it)."
    )
    mig_strategy: Literal["none", "single", "mixed"] = Field(
        "none", description="GPU Operator MIG strategy."
    )
    priorities: list[PriorityClassSpec] = Field(default_factory=_default_priorities)


class GpuSpec(StrictModel):
    """The GPUs of one node."""

    model: str = Field(..., description="Short model name, like 'H100' (see compat.GPU_MODELS).")
    count: int = Field(..., ge=1, le=16)
    interconnect: Literal["none", "nvlink", "nvswitch"] = Field(
        "none", description="'nvswitch' for HGX/DGX baseboards (needs Fabric Manager)."
    )


class IbSpec(StrictModel):
    """InfiniBand (or RoCE) HCAs used for GPU traffic."""

    hcas: list[str] = Field(..., min_length=1, description="Device names, like 'mlx5_0'.")
    rails: int = Field(..., ge=1, le=16, description="Rail-optimised planes (usually one per HCA).")
    rate_gbps: int = Field(..., ge=1, description="Expected port rate, like 400 for NDR.")


class NodeSpec(StrictModel):
    """One GPU node."""

    name: str = Field(..., pattern=_DNS_NAME, max_length=63, description="Kubernetes node name.")
    gpu: GpuSpec
    ib: IbSpec | None = None
    rack: str = Field(..., pattern=_LABEL_VALUE, max_length=63)
    leaf: str = Field(..., pattern=_LABEL_VALUE, max_length=63, description="Leaf switch.")
    spine: str = Field(
        ..., pattern=_LABEL_VALUE, max_length=63, description="Spine block above the leaf."
    )
    cpu: int = Field(..., ge=1, description="CPU cores.")
    memory: Bytes = Field(..., gt=0, description="RAM like '2Ti'.")
    nvme: Bytes = Field(0, ge=0, description="Local NVMe like '30Ti' (0: none).")


class InventoryFile(StrictModel):
    cluster: ClusterSettings
    nodes: list[NodeSpec] = Field(..., min_length=1)
    quotas: dict[str, Any] | list[Any] = Field(default_factory=list)


class Inventory:
    """A validated inventory: unique node names, known GPU models, a compatible software
    stack, and quotas that fit the GPUs present."""

    def __init__(self, cluster: ClusterSettings, nodes: list[NodeSpec], quotas: QuotaConfig):
        self.cluster = cluster
        self.nodes = nodes
        self.quotas = quotas

    def gpus_by_model(self) -> dict[str, int]:
        """Total GPUs per model, in first-seen order."""
        totals: dict[str, int] = {}
        for node in self.nodes:
            totals[node.gpu.model] = totals.get(node.gpu.model, 0) + node.gpu.count
        return totals

    @property
    def has_ib(self) -> bool:
        return any(n.ib is not None for n in self.nodes)

    @property
    def has_nvswitch(self) -> bool:
        return any(n.gpu.interconnect == "nvswitch" for n in self.nodes)

    @property
    def stack(self) -> SoftwareStack:
        s = self.cluster.software
        return SoftwareStack(driver=s.driver, cuda=s.cuda, pytorch=s.pytorch, nccl=s.nccl)


def parse_inventory(data: Any, *, source: str = "") -> Inventory:
    """Validate a mapping into an Inventory, or raise SpecError naming every bad field."""
    try:
        model = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source=source) from exc
    issues = _node_issues(model.nodes)
    quotas = _quotas(model.quotas, issues, source)
    if quotas is not None:
        issues += _quota_issues(quotas, model.nodes)
    models = list(dict.fromkeys(n.gpu.model for n in model.nodes if n.gpu.model in GPU_MODELS))
    stack = model.cluster.software
    issues += check_stack(
        SoftwareStack(stack.driver, stack.cuda, stack.pytorch, stack.nccl), models
    )
    issues += _priority_issues(model.cluster.priorities)
    if issues or quotas is None:
        raise SpecError(issues, source=source)
    return Inventory(model.cluster, model.nodes, quotas)


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory YAML file."""
    file = Path(path)
    data = load_yaml_text(read_spec_file(file), source=str(file))
    return parse_inventory(data, source=str(file))


def _node_issues(nodes: list[NodeSpec]) -> list[FieldIssue]:
    issues: list[FieldIssue] = []
    counts = Counter(n.name for n in nodes)
    seen: set[str] = set()
    known = ", ".join(GPU_MODELS)
    for i, node in enumerate(nodes):
        if counts[node.name] > 1 and node.name in seen:
            first = next(j for j, n in enumerate(nodes) if n.name == node.name)
            issues.append(
                FieldIssue(
                    f"nodes.{i}.name",
                    f"node name {node.name!r} is already used by nodes.{first}",
                    "give every node its own name (the Kubernetes node name)",
                )
            )
        seen.add(node.name)
        if node.gpu.model not in GPU_MODELS:
            issues.append(
                FieldIssue(
                    f"nodes.{i}.gpu.model",
                    f"unknown GPU model {node.gpu.model!r} (known: {known})",
                    "use one of the known short names, or add the model to "
                    "tensoryard.cluster.compat.GPU_MODELS with its facts",
                )
            )
        if node.ib is not None and len(node.ib.hcas) != len(set(node.ib.hcas)):
            issues.append(
                FieldIssue(f"nodes.{i}.ib.hcas", "an HCA is listed twice", "list each once")
            )
    return issues


def _quotas(raw: Any, issues: list[FieldIssue], source: str) -> QuotaConfig | None:
    try:
        return parse_quota_config(raw, source=source)
    except SpecError as exc:
        issues += [FieldIssue(f"quotas.{i.path}".rstrip("."), i.message, i.fix) for i in exc.issues]
    except ConfigError as exc:
        issues.append(FieldIssue("quotas", str(exc).removeprefix(f"{source}: "), ""))
    return None


def _quota_issues(quotas: QuotaConfig, nodes: list[NodeSpec]) -> list[FieldIssue]:
    present: dict[str, int] = {}
    for node in nodes:
        present[node.gpu.model] = present.get(node.gpu.model, 0) + node.gpu.count
    issues: list[FieldIssue] = []
    owners = [("queues", i, q.nominal) for i, q in enumerate(quotas.queues)]
    owners += [("cohorts", i, c.nominal) for i, c in enumerate(quotas.cohorts)]
    total: dict[str, int] = {}
    for kind, i, nominal in owners:
        for model, amount in nominal.items():
            total[model] = total.get(model, 0) + amount
            if model not in present and amount > 0:
                issues.append(
                    FieldIssue(
                        f"quotas.{kind}.{i}.nominal.{model}",
                        f"quota for {model}, but no node in the inventory has {model} GPUs "
                        f"(present: {', '.join(present) or 'none'})",
                        "correct the model name or add the nodes",
                    )
                )
    for model, amount in total.items():
        have = present.get(model, 0)
        if model in present and amount > have:
            issues.append(
                FieldIssue(
                    f"quotas.queues.*.nominal.{model}",
                    f"nominal quotas for {model} add up to {amount} GPUs but the inventory "
                    f"has {have}",
                    f"lower the nominal quotas to {have} {model} in total, or add nodes",
                )
            )
    return issues


def _priority_issues(priorities: list[PriorityClassSpec]) -> list[FieldIssue]:
    issues: list[FieldIssue] = []
    seen: set[str] = set()
    for i, p in enumerate(priorities):
        if p.name in seen:
            issues.append(
                FieldIssue(f"cluster.priorities.{i}.name", f"{p.name!r} is used twice", "rename")
            )
        seen.add(p.name)
    return issues
