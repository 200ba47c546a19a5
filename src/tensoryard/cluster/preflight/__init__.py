"""`tyard cluster preflight`: is this GPU node fit to take jobs?

Checks (each takes a CommandRunner, so tests replay recorded outputs): GPUs and models, driver /
CUDA / PyTorch / NCCL against the compatibility table and the inventory, Fabric Manager on
NVSwitch nodes, NVLink topology and link state, ECC and row remapping, InfiniBand ports, and a
short all-reduce (NCCL on GPUs with a bus-bandwidth floor per model, gloo on CPUs).
"""

from __future__ import annotations

from tensoryard.cluster.preflight.allreduce import AllReduceResult, run_allreduce
from tensoryard.cluster.preflight.checks import CheckResult, Expectations, TorchVersions
from tensoryard.cluster.preflight.report import (
    PreflightReport,
    check_allreduce,
    expectations_for,
    post_report,
    run_preflight,
)
from tensoryard.cluster.preflight.runner import (
    CommandResult,
    CommandRunner,
    RecordedRunner,
    RecordingRunner,
    SubprocessRunner,
)

__all__ = [
    "AllReduceResult",
    "CheckResult",
    "CommandResult",
    "CommandRunner",
    "Expectations",
    "PreflightReport",
    "RecordedRunner",
    "RecordingRunner",
    "SubprocessRunner",
    "TorchVersions",
    "check_allreduce",
    "expectations_for",
    "post_report",
    "run_allreduce",
    "run_preflight",
]
