"""Building the GPU cluster itself: inventory, compatibility table, generated configuration
(node labels, GPU Operator, Kueue, Prometheus) and the node preflight.

    inventory.py     the inventory file, validated once (SpecError naming every field)
    compat.py        driver / CUDA / PyTorch / NCCL / architecture facts, with sources
    labels.py        topology labels and taints (what placement and Kueue's Topology read)
    gpu_operator.py  GPU Operator / Network Operator values, DCGM exporter metric list
    kueue.py         Kueue objects mirroring the platform's queues
    prometheus.py    scrape configuration
    plan.py          all of the above as files, written atomically
    crds.py          validation of generated objects against CRD schemas
    preflight/       checks run on a GPU node (command runner injected)
"""

from __future__ import annotations

from tensoryard.cluster.compat import SoftwareStack, check_stack
from tensoryard.cluster.inventory import Inventory, load_inventory, parse_inventory
from tensoryard.cluster.plan import Plan, build_plan, write_plan

__all__ = [
    "Inventory",
    "Plan",
    "SoftwareStack",
    "build_plan",
    "check_stack",
    "load_inventory",
    "parse_inventory",
    "write_plan",
]
