#!/usr/bin/env python3
"""Record what PyPI's torch wheels pin: CUDA, NCCL, cuDNN, Python tags, for the compatibility tests.

    python images/tools/pypi_torch_wheels.py 2.13.0 2.14.1 > pypi_torch_wheels.json

Reads PyPI's simple index (JSON form) for the list of files, then each Linux x86_64 cp311 wheel's
``METADATA`` and ``torch/version.py`` through HTTP range requests (a few hundred KB per wheel,
not the whole wheel). Standard library only.
"""

from __future__ import annotations

import io
import json
import re
import sys
import urllib.request
import zipfile
from typing import Any

INDEX = "https://pypi.org/simple/torch/"


class _RangeReader(io.RawIOBase):
    """A seekable file over HTTP range requests, enough for zipfile to read one member."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.size - self.pos)
        if count <= 0:
            return 0
        headers = {"Range": f"bytes={self.pos}-{self.pos + count - 1}"}
        with urllib.request.urlopen(urllib.request.Request(self.url, headers=headers)) as resp:
            data = resp.read()
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _pin(requires: list[str], name: str) -> str | None:
    for line in requires:
        if line.startswith(name):
            match = re.search(r"==\s*([\d.]+)", line)
            return match.group(1) if match else None
    return None


def describe(files: list[dict[str, Any]], version: str) -> dict[str, Any]:
    linux = [
        f
        for f in files
        if f["filename"].startswith(f"torch-{version}-")
        and "manylinux" in f["filename"]
        and "x86_64" in f["filename"]
    ]
    tags = sorted(
        {re.search(r"-(cp\d+)-", f["filename"]).group(1) for f in linux},  # type: ignore[union-attr]
        key=lambda tag: int(tag[2:]),
    )
    wheel = next(f for f in linux if "-cp311-cp311-" in f["filename"])
    archive = zipfile.ZipFile(io.BufferedReader(_RangeReader(wheel["url"], wheel["size"]), 1 << 20))
    metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [
        line.split(": ", 1)[1]
        for line in archive.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    version_py = archive.read("torch/version.py").decode()
    cuda = re.search(r"cuda: Optional\[str\] = '([\d.]+)'", version_py)
    return {
        "torch": version,
        "cuda": cuda.group(1) if cuda else None,
        "nccl": _pin(requires, "nvidia-nccl"),
        "cudnn": _pin(requires, "nvidia-cudnn"),
        "python_tags": tags,
        "wheel": wheel["filename"],
        "url": wheel["url"],
    }


def main(versions: list[str]) -> None:
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request) as resp:
        files = json.load(resp)["files"]
    rows = [describe(files, version) for version in versions]
    json.dump({"source": INDEX, "wheels": rows}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
