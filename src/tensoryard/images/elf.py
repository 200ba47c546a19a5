"""Which shared libraries a CPU image's torch can ever load, to drop the CUDA files it cannot.

PyPI's torch carries CUDA as nvidia-* wheels. On the CPU only what the dynamic loader needs to
``import torch`` is used: the DT_NEEDED closure of torch's own libraries. Libraries outside it
(cuDNN's engine libraries, which ``libcudnn.so`` opens only when a GPU runs a convolution,
cusolverMg, the alternative NVRTC, profiler host libraries) and the CUDA headers are dead weight
in a CPU image. :func:`prune_unlinked` removes them and says what it removed.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["needed", "prune_unlinked"]

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


def needed(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file ([] for anything else)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries, strtab = [], None
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            entries.append(value)
        elif tag == _DT_STRTAB:
            strtab = next(
                (
                    off + value - vaddr
                    for vaddr, off, size in loads
                    if vaddr <= value < vaddr + size
                ),
                None,
            )
    if strtab is None:
        return []
    return [data[strtab + e : data.index(b"\0", strtab + e)].decode() for e in entries]


def _libraries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink())


def prune_unlinked(site_packages: Path, *, dry_run: bool = False) -> dict[str, int]:
    """Delete the files under ``site_packages/nvidia`` that no torch library can load (outside
    the DT_NEEDED closure of ``torch/lib`` and torch's extension modules) and the CUDA headers.
    Returns {relative path: bytes} of what was removed."""
    nvidia = site_packages / "nvidia"
    if not nvidia.is_dir():
        return {}
    by_name: dict[str, list[Path]] = {}
    for lib in _libraries(nvidia):
        by_name.setdefault(lib.name, []).append(lib)
    keep: set[Path] = set()
    todo = [*_libraries(site_packages / "torch" / "lib"), *(site_packages / "torch").glob("_C*.so")]
    seen: set[Path] = set()
    while todo:
        lib = todo.pop()
        if lib in seen:
            continue
        seen.add(lib)
        for name in needed(lib):
            for found in by_name.get(name, []):
                keep.add(found.resolve())
                todo.append(found)
    removed: dict[str, int] = {}
    for path in sorted(nvidia.rglob("*")):
        dead_lib = ".so" in path.name and path.is_file() and path.resolve() not in keep
        header = "include" in path.relative_to(nvidia).parts and path.is_file()
        if (dead_lib or header) and not path.is_symlink():
            removed[str(path.relative_to(site_packages))] = path.stat().st_size
            if not dry_run:
                path.unlink()
    return removed
