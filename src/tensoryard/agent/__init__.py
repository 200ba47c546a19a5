"""The node agent: what this machine offers (inventory, NVML) and its service."""

from tensoryard.agent.inventory import GpuInfo, Inventory, collect_inventory

__all__ = ["GpuInfo", "Inventory", "collect_inventory"]
