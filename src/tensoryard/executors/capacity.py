"""What a cluster backend reports of its nodes: the capacity the scheduler places jobs on.

Every backend (the local agent, Kubernetes' Node objects, Slurm's nodes) describes its nodes in
these terms and the control loop's scheduling seam (``tensoryard.server.scheduling``) reads
them; the type lives here, below both, so that the executors never import the server.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeCapacity"]


@dataclass(frozen=True)
class NodeCapacity:
    """One node as the agent reports it."""

    name: str
    cpu_slots: float
    memory_bytes: int
    gpu_indices: tuple[int, ...] = ()
    gpu_model: str | None = None
    switch: str = ""  # leaf switch ("" unknown); topology-aware placement groups by it
    block: str = ""  # spine block above the switch
    cordoned: bool = False  # takes no new jobs (cordoned, not ready, tainted)
    unavailable_gpus: tuple[int, ...] = ()  # held by workloads tensoryard did not start
    state: str = "ready"  # ready | cordoned | draining (the health loop; no new placements)
    # What the cluster itself says of a node that takes no new jobs ("NotReady since ... (why)",
    # "unschedulable", "tainted k=v:NoSchedule"); "" while it is open. Shown by `tyard nodes`.
    condition: str = ""
