"""Parsers for nvidia-smi, systemctl and ibstat text output (pure functions, no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "GpuRow",
    "IbPort",
    "RemapRow",
    "parse_fabric_state",
    "parse_gpu_query",
    "parse_ibstat",
    "parse_nvlink_status",
    "parse_remapped_rows",
    "parse_topology",
]


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One line of `nvidia-smi --query-gpu=index,name,driver_version,ecc.mode.current,
    ecc.errors.uncorrected.volatile.total --format=csv,noheader`."""

    index: int
    name: str
    driver: str
    ecc_mode: str
    ecc_uncorrected: int | None


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_gpu_query(text: str) -> list[GpuRow]:
    rows: list[GpuRow] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        rows.append(GpuRow(int(parts[0]), parts[1], parts[2], parts[3], _int(parts[4])))
    return rows


@dataclass(frozen=True, slots=True)
class RemapRow:
    """One GPU of `nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,
    remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv`."""

    bus_id: str
    correctable: int | None
    uncorrectable: int | None
    pending: bool
    failure: bool


def _flag(text: str) -> bool:
    return text.strip().lower() in {"1", "yes", "true"}


def parse_remapped_rows(text: str) -> list[RemapRow]:
    rows: list[RemapRow] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or parts[0].startswith("gpu_bus_id"):
            continue
        rows.append(
            RemapRow(parts[0], _int(parts[1]), _int(parts[2]), _flag(parts[3]), _flag(parts[4]))
        )
    return rows


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` -> {(gpu_i, gpu_j): 'NV18' | 'SYS' | ...} for GPU pairs i != j."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.split()[0] == "GPU0"), None)
    if start is None:
        return {}
    columns = lines[start].split()  # the header; each row below has its name in front
    gpu_cols = [i for i, c in enumerate(columns) if re.fullmatch(r"GPU\d+", c)]
    pairs: dict[tuple[int, int], str] = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for col in gpu_cols:
            if col + 1 < len(cells):
                other = int(columns[col][3:])
                if other != row:
                    pairs[(row, other)] = cells[col + 1]
    return pairs


def parse_nvlink_status(text: str) -> dict[int, list[float | None]]:
    """`nvidia-smi nvlink --status` -> {gpu: [GB/s per link, None when inactive]}."""
    links: dict[int, list[float | None]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        head = re.match(r"^GPU (\d+):", line)
        if head:
            gpu = int(head.group(1))
            links[gpu] = []
            continue
        link = re.match(r"^\s+Link \d+: (.*)$", line)
        if link and gpu is not None:
            speed = re.match(r"([\d.]+) GB/s", link.group(1).strip())
            links[gpu].append(float(speed.group(1)) if speed else None)
    return links


def parse_fabric_state(text: str) -> list[tuple[str, str]]:
    """(State, Status) of each GPU's 'Fabric' section in `nvidia-smi -q` (Hopper and newer)."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Fabric":
            continue
        values: dict[str, str] = {}
        for follow in lines[i + 1 : i + 6]:
            key, _, value = follow.partition(":")
            values[key.strip()] = value.strip()
        out.append((values.get("State", ""), values.get("Status", "")))
    return out


@dataclass
class IbPort:
    """One port of one HCA in `ibstat`."""

    ca: str
    port: int
    state: str = ""
    physical_state: str = ""
    rate: int | None = None
    link_layer: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def parse_ibstat(text: str) -> list[IbPort]:
    ports: list[IbPort] = []
    ca = ""
    current: IbPort | None = None
    for line in text.splitlines():
        ca_match = re.match(r"^CA '([^']+)'", line)
        if ca_match:
            ca, current = ca_match.group(1), None
            continue
        port_match = re.match(r"^\s+Port (\d+):\s*$", line)
        if port_match and ca:
            current = IbPort(ca, int(port_match.group(1)))
            ports.append(current)
            continue
        if current is None or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "State":
            current.state = value
        elif key == "Physical state":
            current.physical_state = value
        elif key == "Rate":
            current.rate = _int(value)
        elif key == "Link layer":
            current.link_layer = value
        else:
            current.extra[key] = value
    return ports
