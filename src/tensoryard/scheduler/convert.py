"""Build scheduler snapshot types from specs (ClusterSpec nodes, JobSpec workloads)."""

from __future__ import annotations

from tensoryard.scheduler.model import Node, Workload
from tensoryard.spec.cluster import ClusterSpec
from tensoryard.spec.job import JobSpec

__all__ = ["nodes_from_cluster", "workload_from_job"]


def nodes_from_cluster(spec: ClusterSpec) -> tuple[Node, ...]:
    """Every node of a ClusterSpec as a scheduler Node (all healthy and schedulable)."""
    return tuple(
        Node(
            name=info.name,
            gpu_model=info.gpu_model,
            gpus_total=info.gpus,
            cpu_total=info.cpu,
            mem_total=info.memory,
            switch=info.switch,
            block=info.block,
        )
        for info in spec.expand()
    )


def workload_from_job(
    job_id: str,
    spec: JobSpec,
    *,
    submit_time: float,
    queue: str | None = None,
    runtime_estimate_s: float | None = None,
    attained_service_s: float = 0.0,
) -> Workload:
    """A pending Workload for a JobSpec; the runtime estimate defaults to `max_runtime`."""
    res = spec.resources
    return Workload(
        id=job_id,
        queue=queue or spec.team,
        nodes=res.nodes,
        gpus_per_node=res.gpus_per_node,
        cpu_per_node=res.cpu,
        mem_per_node=res.memory,
        gpu_model=spec.scheduling.gpu_model,
        priority=spec.priority,
        submit_time=submit_time,
        preemptible=spec.scheduling.preemptible,
        topology=spec.scheduling.topology,
        runtime_estimate_s=runtime_estimate_s
        if runtime_estimate_s is not None
        else spec.max_runtime,
        attained_service_s=attained_service_s,
    )
