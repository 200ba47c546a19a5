"""The preflight checks. Each takes what it needs (a command runner, the expectations from the
inventory) and returns a CheckResult; none raises for a broken node, it reports it.

Statuses: ``pass``; ``fail`` (the node should not take jobs); ``warn`` (works, but look at
it); ``skip`` (not applicable here, or the tool is missing where that is expected, e.g.
no ``ibstat`` on a node without InfiniBand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tensoryard.agent.inventory import gpu_model
from tensoryard.cluster.compat import SoftwareStack, check_stack, parse_version
from tensoryard.cluster.preflight.parsers import (
    parse_fabric_state,
    parse_gpu_query,
    parse_ibstat,
    parse_nvlink_status,
    parse_remapped_rows,
    parse_topology,
)
from tensoryard.cluster.preflight.runner import CommandResult, CommandRunner

__all__ = [
    "GPU_QUERY",
    "REMAP_QUERY",
    "CheckResult",
    "Expectations",
    "Status",
    "TorchVersions",
    "check_ecc",
    "check_fabric_manager",
    "check_gpus",
    "check_infiniband",
    "check_nvlink",
    "check_topology",
    "check_versions",
    "torch_versions",
]

Status = Literal["pass", "fail", "warn", "skip"]

GPU_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,driver_version,ecc.mode.current,ecc.errors.uncorrected.volatile.total",
    "--format=csv,noheader",
]
REMAP_QUERY = [
    "nvidia-smi",
    "--query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,"
    "remapped_rows.pending,remapped_rows.failure",
    "--format=csv",
]


@dataclass
class CheckResult:
    """The outcome of one check, with the data it looked at."""

    name: str
    status: Status
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "details": self.details,
        }


@dataclass(frozen=True)
class Expectations:
    """What this node should be (from the inventory); None fields are not checked."""

    gpu_model: str | None = None
    gpu_count: int | None = None
    interconnect: str | None = None  # none | nvlink | nvswitch
    ib_hcas: tuple[str, ...] = ()
    ib_rate_gbps: int | None = None
    software: SoftwareStack | None = None


@dataclass(frozen=True)
class TorchVersions:
    """What the jobs' PyTorch reports: its version, its CUDA build, its bundled NCCL."""

    pytorch: str
    cuda: str | None
    nccl: str | None


def torch_versions() -> TorchVersions:
    """The installed torch's versions (imports torch)."""
    import torch

    nccl: str | None = None
    if torch.cuda.is_available() or torch.version.cuda:
        try:
            raw = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
        except (RuntimeError, AttributeError):
            nccl = None
    return TorchVersions(torch.__version__.split("+")[0], torch.version.cuda, nccl)


def _missing(name: str, result: CommandResult, why: str, expect: Expectations) -> CheckResult:
    """A tool failed: a missing nvidia-smi is 'skip' only where no GPU is expected."""
    status: Status = "skip" if result.returncode == 127 and not expect.gpu_count else "fail"
    text = result.stderr.strip() or f"exit code {result.returncode}"
    return CheckResult(name, status, f"{why}: {text}")


def check_gpus(run: CommandRunner, expect: Expectations) -> CheckResult:
    """GPUs present, their model and count as the inventory says."""
    result = run(GPU_QUERY)
    if not result.ok:
        return _missing("gpus", result, "nvidia-smi cannot list GPUs", expect)
    rows = parse_gpu_query(result.stdout)
    models = sorted({gpu_model(r.name) for r in rows})
    details = {"count": len(rows), "models": models, "names": sorted({r.name for r in rows})}
    problems = []
    if expect.gpu_count is not None and len(rows) != expect.gpu_count:
        problems.append(f"{len(rows)} GPUs visible, the inventory says {expect.gpu_count}")
    if expect.gpu_model is not None and models != [expect.gpu_model]:
        problems.append(f"GPU models {models}, the inventory says {expect.gpu_model}")
    if problems:
        return CheckResult("gpus", "fail", "; ".join(problems), details)
    return CheckResult("gpus", "pass", f"{len(rows)} x {', '.join(models)}", details)


def check_versions(
    run: CommandRunner,
    expect: Expectations,
    torch_info: Callable[[], TorchVersions] = torch_versions,
) -> CheckResult:
    """Driver (nvidia-smi), CUDA, PyTorch and NCCL (torch) against the table and inventory."""
    result = run(GPU_QUERY)
    rows = parse_gpu_query(result.stdout) if result.ok else []
    if not rows:
        return _missing("versions", result, "no driver version (nvidia-smi)", expect)
    versions = torch_info()
    found = SoftwareStack(
        driver=rows[0].driver,
        cuda=versions.cuda or "",
        pytorch=versions.pytorch,
        nccl=versions.nccl or "",
    )
    details: dict[str, Any] = {"found": _stack_dict(found)}
    if not versions.cuda:
        return CheckResult("versions", "fail", "PyTorch is a CPU build (no CUDA)", details)
    models = sorted({gpu_model(r.name) for r in rows})
    issues = check_stack(found, models, prefix="found")
    problems = [f"{i.message} (fix: {i.fix})" for i in issues]
    if expect.software is not None:
        problems += _differences(found, expect.software)
    if problems:
        return CheckResult("versions", "fail", "; ".join(problems), details)
    return CheckResult("versions", "pass", _stack_text(found), details)


def _stack_dict(stack: SoftwareStack) -> dict[str, str]:
    return {k: getattr(stack, k) for k in ("driver", "cuda", "pytorch", "nccl")}


def _stack_text(stack: SoftwareStack) -> str:
    return ", ".join(f"{k} {v}" for k, v in _stack_dict(stack).items())


def _differences(found: SoftwareStack, want: SoftwareStack) -> list[str]:
    out = []
    for key, have in _stack_dict(found).items():
        expected = getattr(want, key)
        a, b = parse_version(have), parse_version(expected)
        if a is None or b is None or a[: len(b)] != b:
            out.append(f"{key} is {have or 'missing'}, the inventory says {expected}")
    return out


def check_fabric_manager(run: CommandRunner, expect: Expectations) -> CheckResult:
    """On NVSwitch systems: nvidia-fabricmanager active, and every GPU's fabric registered."""
    if expect.interconnect != "nvswitch":
        return CheckResult("fabric_manager", "skip", "no NVSwitch on this node")
    service = run(["systemctl", "is-active", "nvidia-fabricmanager"])
    state = service.stdout.strip() or "unknown"
    query = run(["nvidia-smi", "-q"])
    fabric = parse_fabric_state(query.stdout) if query.ok else []
    details = {"service": state, "gpu_fabric": [list(f) for f in fabric]}
    # Hopper and newer report the fabric state per GPU; there it is the stronger signal (the
    # service may run inside the GPU Operator's driver container, invisible to systemctl).
    if fabric:
        bad = [
            i for i, (st, status) in enumerate(fabric) if (st, status) != ("Completed", "Success")
        ]
        if bad:
            return CheckResult(
                "fabric_manager",
                "fail",
                f"GPU fabric not ready on GPUs {bad} (state/status {fabric[bad[0]]}); "
                "start nvidia-fabricmanager with the driver's exact version",
                details,
            )
        return CheckResult("fabric_manager", "pass", "fabric registered on every GPU", details)
    if state != "active":
        return CheckResult(
            "fabric_manager",
            "fail",
            f"nvidia-fabricmanager is {state}; CUDA cannot use NVSwitch without it "
            "(fix: systemctl enable --now nvidia-fabricmanager, same version as the driver)",
            details,
        )
    return CheckResult("fabric_manager", "pass", "nvidia-fabricmanager is active", details)


def check_topology(run: CommandRunner, expect: Expectations) -> CheckResult:
    """Every GPU pair on NVLink (NV#) where the inventory says NVLink or NVSwitch."""
    result = run(["nvidia-smi", "topo", "-m"])
    if not result.ok:
        return _missing("topology", result, "nvidia-smi topo -m failed", expect)
    pairs = parse_topology(result.stdout)
    kinds = sorted(set(pairs.values()))
    details = {"pairs": len(pairs), "link_kinds": kinds}
    if expect.interconnect not in ("nvlink", "nvswitch"):
        return CheckResult("topology", "pass", f"links: {', '.join(kinds) or 'one GPU'}", details)
    off = sorted((a, b) for (a, b), kind in pairs.items() if not kind.startswith("NV") and a < b)
    if off:
        details["not_nvlink"] = [list(p) for p in off]
        shown = ", ".join(f"GPU{a}-GPU{b}" for a, b in off[:6])
        return CheckResult(
            "topology", "fail", f"{len(off)} GPU pairs not on NVLink: {shown}", details
        )
    if expect.interconnect == "nvswitch" and len(kinds) > 1:
        return CheckResult(
            "topology", "fail", f"uneven NVLink counts {kinds} on an NVSwitch node", details
        )
    return CheckResult("topology", "pass", f"all {len(pairs)} GPU pairs on {kinds[0]}", details)


def check_nvlink(run: CommandRunner, expect: Expectations) -> CheckResult:
    """No inactive NVLink where NVLink is expected."""
    if expect.interconnect not in ("nvlink", "nvswitch"):
        return CheckResult("nvlink", "skip", "no NVLink on this node")
    result = run(["nvidia-smi", "nvlink", "--status"])
    if not result.ok:
        return _missing("nvlink", result, "nvidia-smi nvlink --status failed", expect)
    links = parse_nvlink_status(result.stdout)
    inactive = {g: [i for i, s in enumerate(ls) if s is None] for g, ls in links.items()}
    inactive = {g: ix for g, ix in inactive.items() if ix}
    counts = sorted({len(ls) for ls in links.values()})
    details = {"gpus": len(links), "links_per_gpu": counts, "inactive": inactive}
    if inactive:
        shown = "; ".join(f"GPU {g}: links {ix}" for g, ix in inactive.items())
        return CheckResult("nvlink", "fail", f"inactive NVLinks ({shown})", details)
    if not links:
        return CheckResult("nvlink", "fail", "no NVLink reported", details)
    return CheckResult("nvlink", "pass", f"{len(links)} GPUs, all links active", details)


def check_ecc(run: CommandRunner, expect: Expectations) -> CheckResult:
    """ECC on, no uncorrected volatile errors, no pending or failed row remapping."""
    gpus = run(GPU_QUERY)
    if not gpus.ok:
        return _missing("ecc", gpus, "nvidia-smi cannot query ECC", expect)
    rows = parse_gpu_query(gpus.stdout)
    remap = run(REMAP_QUERY)
    remaps = parse_remapped_rows(remap.stdout) if remap.ok else []
    fails: list[str] = []
    warns: list[str] = []
    for r in rows:
        if r.ecc_mode not in ("Enabled", "[N/A]", "N/A"):
            warns.append(f"GPU {r.index} ECC is {r.ecc_mode}")
        if r.ecc_uncorrected:
            fails.append(f"GPU {r.index} has {r.ecc_uncorrected} uncorrected ECC errors")
    for m in remaps:
        if m.failure:
            fails.append(f"GPU {m.bus_id} row remapping FAILED (RMA candidate)")
        elif m.pending:
            fails.append(f"GPU {m.bus_id} has a row remap pending (reset the GPU)")
        elif m.uncorrectable:
            warns.append(f"GPU {m.bus_id} remapped {m.uncorrectable} rows for uncorrectable errors")
    details = {"gpus": len(rows), "remap_rows_reported": len(remaps)}
    if fails:
        return CheckResult("ecc", "fail", "; ".join(fails + warns), details)
    if warns:
        return CheckResult("ecc", "warn", "; ".join(warns), details)
    return CheckResult("ecc", "pass", f"ECC clean on {len(rows)} GPUs", details)


def check_infiniband(run: CommandRunner, expect: Expectations) -> CheckResult:
    """Each expected HCA has a port Active / LinkUp at the expected rate."""
    if not expect.ib_hcas:
        return CheckResult("infiniband", "skip", "no InfiniBand expected on this node")
    result = run(["ibstat"])
    # ibstat exits non-zero when one device fails to open but still prints the others
    # (leptonai/gpud#752 reads that partial output the same way).
    if not result.ok and "CA '" not in result.stdout:
        return CheckResult("infiniband", "fail", f"ibstat failed: {result.stderr.strip()}")
    ports = parse_ibstat(result.stdout)
    problems = []
    for hca in expect.ib_hcas:
        mine = [p for p in ports if p.ca == hca]
        if not mine:
            problems.append(f"{hca} missing")
        for port in mine:
            where = f"{hca} port {port.port}"
            if port.state != "Active" or port.physical_state != "LinkUp":
                problems.append(f"{where} is {port.state}/{port.physical_state}")
            elif expect.ib_rate_gbps is not None and port.rate != expect.ib_rate_gbps:
                problems.append(f"{where} runs at {port.rate} Gb/s, expected {expect.ib_rate_gbps}")
    details = {
        "ports": [{"ca": p.ca, "port": p.port, "state": p.state, "rate": p.rate} for p in ports]
    }
    if problems:
        return CheckResult("infiniband", "fail", "; ".join(problems), details)
    rate = f" at {expect.ib_rate_gbps} Gb/s" if expect.ib_rate_gbps else ""
    return CheckResult("infiniband", "pass", f"{len(expect.ib_hcas)} HCAs active{rate}", details)
