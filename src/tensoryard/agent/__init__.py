"""The node agent: what this machine offers (inventory, NVML) and GPU assignment."""

from tensoryard.agent.gpus import cuda_visible_devices
from tensoryard.agent.inventory import GpuInfo, Inventory, collect_inventory

__all__ = ["GpuInfo", "Inventory", "collect_inventory", "cuda_visible_devices"]
