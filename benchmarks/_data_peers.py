"""Virtual environments of the peer loaders for `benchmarks/data_loader.py`.

Each peer gets its own venv under ``benchmarks/.venvs/<name>`` so that its pins never reach the
project's environment. Every install is constrained to ``torch==2.13.0`` (the CPU build on this
machine's disk); anything asking for another torch fails instead of downloading a CUDA build.

* litdata 0.2.76 declares torchvision, which would replace torch: it is installed with
  ``--no-deps`` plus its real requirements (its token loading never imports torchvision).
* mosaicml-streaming 0.13.0 pins ``numpy<2.2`` and ``import streaming`` imports torchvision
  (for its vision datasets), and PyPI's torchvision does not load beside the CPU torch. It is
  installed with ``--no-deps`` plus the requirements its MDS reader uses, and a stub
  ``torchvision`` package is written into *that venv's* site-packages only: it defines the three
  names streaming imports at start (``VisionDataset``, ``CIFAR10``, ``to_tensor``) and raises if
  any is used. The MDS text/token path never touches them.
* HF datasets installs normally (its requirements do not include torch; torch is added pinned).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

VENVS = Path(__file__).resolve().parent / ".venvs"
TORCH_PIN = "torch==2.13.0"


@dataclass(frozen=True)
class Peer:
    """How to build one peer's venv."""

    name: str
    deps: list[str]
    no_deps: list[str] = field(default_factory=list)
    stub_torchvision: bool = False

    @property
    def python(self) -> Path:
        return VENVS / self.name / "bin" / "python"

    @property
    def fingerprint(self) -> str:
        text = json.dumps([self.deps, self.no_deps, self.stub_torchvision, STUB_VERSION])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PEERS: dict[str, Peer] = {
    "litdata": Peer(
        "litdata",
        deps=[
            TORCH_PIN,
            "lightning-utilities",
            "filelock",
            "numpy",
            "boto3",
            "requests",
            "urllib3>=1.26",
            "tifffile",
            "obstore",
            "psutil",
        ],
        no_deps=["litdata==0.2.76"],
    ),
    "streaming": Peer(
        "streaming",
        deps=[
            TORCH_PIN,
            "numpy<2.2",
            "Brotli",
            "python-snappy",
            "xxhash<4",
            "zstd",
            "tqdm",
            "catalogue",
            "psutil",
            "boto3",
            "transformers<5",
            "pillow",
        ],
        no_deps=["mosaicml-streaming==0.13.0"],
        stub_torchvision=True,
    ),
    "hf_datasets": Peer("hf_datasets", deps=[TORCH_PIN, "datasets", "psutil"]),
}

STUB_VERSION = 1
_STUB_INIT = '''"""Stub torchvision from tensoryard's benchmarks/_data_peers.py (this venv only).

mosaicml-streaming imports torchvision at start for its vision datasets; PyPI's torchvision
does not load beside the CPU torch here. The MDS token path never uses these names.
"""
'''
_STUB_DATASETS = """class VisionDataset:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision stub: VisionDataset is not available in this venv")


class CIFAR10(VisionDataset):
    pass
"""
_STUB_FUNCTIONAL = """def to_tensor(*args, **kwargs):
    raise RuntimeError("torchvision stub: to_tensor is not available in this venv")
"""


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        head = " ".join(cmd[:4])
        raise RuntimeError(f"{head} ... failed; last lines of {log}:\n" + "\n".join(tail))


def _site_packages(peer: Peer) -> Path:
    out = subprocess.run(
        [str(peer.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _write_stub(peer: Peer) -> None:
    root = _site_packages(peer) / "torchvision"
    (root / "transforms").mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text(_STUB_INIT + "__version__ = '0.0.0+tensoryard.stub'\n")
    (root / "datasets.py").write_text(_STUB_DATASETS)
    (root / "transforms" / "__init__.py").write_text("")
    (root / "transforms" / "functional.py").write_text(_STUB_FUNCTIONAL)


def ensure_venv(name: str, base_python: str | None = None) -> Path:
    """Create (or reuse) the venv of peer ``name``; returns its python. Raises RuntimeError."""
    peer = PEERS[name]
    stamp = VENVS / name / ".tensoryard-stamp"
    if stamp.exists() and stamp.read_text() == peer.fingerprint and peer.python.exists():
        return peer.python
    VENVS.mkdir(parents=True, exist_ok=True)
    log = VENVS / f"{name}.log"
    log.write_text("")
    base = str(base_python or getattr(sys, "_base_executable", sys.executable))
    _run([base, "-m", "venv", "--clear", str(VENVS / name)], log)
    constraints = VENVS / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    pip = [str(peer.python), "-m", "pip", "install", "-q", "-c", str(constraints)]
    _run([*pip, *peer.deps], log)
    if peer.no_deps:
        _run([*pip, "--no-deps", *peer.no_deps], log)
    if peer.stub_torchvision:
        _write_stub(peer)
    stamp.write_text(peer.fingerprint)
    return peer.python


# Light venvs for the cold-start arms (`data_loader.py --cold`): the peer's own packages only,
# torch and numpy come from the interpreter running the benchmark through a .pth file placed
# after the venv's own site-packages (so a pin installed here, e.g. streaming's tokenizers,
# wins). No second multi-GB torch on disk; the peer's S3 client (boto3) comes from there too.
COLD: dict[str, list[str]] = {
    "litdata": ["litdata==0.2.76", "lightning-utilities"],
    "streaming": [
        "mosaicml-streaming==0.13.0",
        "Brotli",
        "python-snappy",
        "xxhash<4",
        "zstd",
        "catalogue",
        "cramjam",
        # streaming imports transformers (<5), which checks these two at import
        "transformers<5",
        "tokenizers>=0.22,<0.23",
        "huggingface-hub>=0.34,<1.0",
    ],
}


def ensure_cold_venv(name: str) -> Path:
    """Create (or reuse) the light venv of peer ``name`` for the cold arms; its python."""
    import sysconfig

    root = VENVS / f"{name}-cold"
    python = root / "bin" / "python"
    stamp = root / ".tensoryard-stamp"
    fingerprint = hashlib.sha256(json.dumps([COLD[name], STUB_VERSION]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == fingerprint and python.exists():
        return python
    VENVS.mkdir(parents=True, exist_ok=True)
    log = VENVS / f"{name}-cold.log"
    log.write_text("")
    base = str(getattr(sys, "_base_executable", sys.executable))
    _run([base, "-m", "venv", "--clear", str(root)], log)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "zz-benchmark-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", *COLD[name]], log)
    if name == "streaming":
        stub = Path(site) / "torchvision"
        (stub / "transforms").mkdir(parents=True, exist_ok=True)
        (stub / "__init__.py").write_text(_STUB_INIT + "__version__ = '0.0.0+tensoryard.stub'\n")
        (stub / "datasets.py").write_text(_STUB_DATASETS)
        (stub / "transforms" / "__init__.py").write_text("")
        (stub / "transforms" / "functional.py").write_text(_STUB_FUNCTIONAL)
    stamp.write_text(fingerprint)
    return python
