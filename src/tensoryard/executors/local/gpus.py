"""GPU assignment for local jobs: which devices a job's processes may see."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensoryard.errors import ExecutorError

__all__ = ["cuda_visible_devices"]


def cuda_visible_devices(placement: Mapping[str, Sequence[int]], gpus_per_node: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES value for a job on this node, or None to leave it unset.

    - a CPU job (gpus_per_node == 0) sees no GPU: "" hides them all;
    - a GPU job sees exactly the GPU indices its placement gives this node;
    - a GPU job without a placement (run by hand, no scheduler) leaves the variable alone.
    """
    if gpus_per_node == 0:
        return ""
    indices = sorted({int(i) for gpus in placement.values() for i in gpus})
    if not indices:
        return None
    if len(indices) != gpus_per_node:
        raise ExecutorError(
            f"placement gives GPUs {indices} but the job asks for {gpus_per_node} per node "
            "(fix: the scheduler must place exactly gpus_per_node GPUs on the node)"
        )
    return ",".join(str(i) for i in indices)
