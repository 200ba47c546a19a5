"""The check that runs inside an image: do its versions agree with the matrix, and does it work?

``tyard images check --inside`` (the images' default command) reads the image's manifest
(``/opt/tensoryard/image.json``, written by the builder) and checks, in order:

1. python, torch, CUDA and NCCL versions against the matrix entry baked into the manifest
2. tensoryard's version against the one the image was built with
3. GPUs: at least one visible in a GPU image; the driver not older than ``min_driver``
4. a tiny all-reduce across 2 processes (gloo on the CPU; NCCL when the image has GPUs)

torch is imported here only, never by the CLI module that calls this.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tensoryard import __version__
from tensoryard.images.compat import version_tuple

__all__ = ["MANIFEST", "Finding", "run_checks"]

MANIFEST = Path("/opt/tensoryard/image.json")
ALLREDUCE_TIMEOUT_S = 180


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def observe() -> dict[str, Any]:
    """What this environment has: versions and visible GPUs."""
    seen: dict[str, Any] = {"python": platform.python_version(), "tensoryard": __version__}
    try:
        import torch
    except ImportError as exc:
        seen["torch_error"] = str(exc)
        return seen
    seen["torch"] = torch.__version__
    seen["torch_cuda"] = torch.version.cuda
    try:
        seen["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):
        seen["nccl"] = None
    seen["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen["driver"] = _driver_version()
    return seen


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML library, no driver: there is no driver to report
        return None


def compare(entry: dict[str, Any], built_with: str, seen: dict[str, Any]) -> list[Finding]:
    """Phases 1-3: every version and the GPU expectation, one finding each."""
    out = []
    want_py = str(entry["python"])
    got_py = ".".join(seen["python"].split(".")[:2])
    out.append(Finding("python", got_py == want_py, f"{seen['python']} (matrix: {want_py})"))
    out.append(
        Finding(
            "tensoryard",
            seen["tensoryard"] == built_with,
            f"{seen['tensoryard']} (built with {built_with})",
        )
    )
    if entry.get("torch") is None:
        return out
    if "torch" not in seen:
        out.append(Finding("torch", False, f"cannot import torch: {seen.get('torch_error')}"))
        return out
    got_torch = str(seen["torch"]).split("+")[0]
    out.append(
        Finding("torch", got_torch == entry["torch"], f"{seen['torch']} (matrix: {entry['torch']})")
    )
    out += _cuda_findings(entry, seen)
    return out


def _cuda_findings(entry: dict[str, Any], seen: dict[str, Any]) -> list[Finding]:
    out = []
    if entry.get("cuda"):
        ok = seen["torch_cuda"] == entry["cuda"]
        out.append(
            Finding(
                "cuda", ok, f"torch built for CUDA {seen['torch_cuda']} (matrix: {entry['cuda']})"
            )
        )
    else:
        out.append(
            Finding(
                "cuda",
                True,
                f"CPU image (the torch wheel carries CUDA {seen['torch_cuda']}; no GPU expected)",
            )
        )
    if entry.get("nccl"):
        ok = seen["nccl"] == entry["nccl"]
        out.append(Finding("nccl", ok, f"{seen['nccl']} (matrix: {entry['nccl']})"))
    if entry.get("gpu"):
        out.append(Finding("gpu", seen["gpus"] > 0, f"{seen['gpus']} visible (expected >= 1)"))
    else:
        out.append(Finding("gpu", True, f"{seen['gpus']} visible (none required)"))
    if entry.get("min_driver") and seen.get("driver"):
        ok = version_tuple(seen["driver"]) >= version_tuple(entry["min_driver"])
        out.append(Finding("driver", ok, f"{seen['driver']} (needs >= {entry['min_driver']})"))
    elif entry.get("gpu"):
        out.append(Finding("driver", False, "no NVIDIA driver visible (NVML)"))
    return out


# ---- phase 4: the all-reduce -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def allreduce(world: int = 2, backend: str = "gloo") -> Finding:
    """Start ``world`` processes that all-reduce their rank+1; each must see the full sum."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tensoryard.images.selfcheck", "--worker", backend],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=ALLREDUCE_TIMEOUT_S)
            outputs.append((proc.returncode, out.strip()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        return Finding("allreduce", False, f"{backend}: timed out after {ALLREDUCE_TIMEOUT_S} s")
    want = world * (world + 1) // 2
    bad = [o for rc, o in outputs if rc != 0 or o.splitlines()[-1:] != [f"sum={want}"]]
    if bad:
        return Finding("allreduce", False, f"{backend}: " + " | ".join(bad)[-600:])
    return Finding("allreduce", True, f"{backend}, {world} processes, sum {want}")


def _worker(backend: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else None
    if device is not None:
        torch.cuda.set_device(device)
    tensor = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(tensor)
    print(f"sum={int(tensor.item())}", flush=True)
    dist.destroy_process_group()


def run_checks(manifest_path: Path = MANIFEST) -> list[Finding]:
    """Every check, in order; the all-reduce only when the versions agree."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return [
            Finding(
                "manifest",
                False,
                f"cannot read {manifest_path}: {exc}; run this "
                "inside a tensoryard image, or pass IMAGE",
            )
        ]
    entry = manifest["entry"]
    seen = observe()
    findings = [Finding("manifest", True, f"{manifest['name']} ({manifest['ref']})")]
    findings += compare(entry, manifest["tensoryard"], seen)
    if entry.get("torch") and all(f.ok for f in findings):
        gpus = int(seen.get("gpus") or 0)
        if entry.get("gpu") and gpus:
            findings.append(allreduce(min(2, gpus), "nccl"))
        else:
            findings.append(allreduce(2, "gloo"))
    return findings


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2])
