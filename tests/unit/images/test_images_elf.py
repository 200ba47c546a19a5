"""DT_NEEDED reading and the CPU image's pruning of CUDA files torch cannot load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tensoryard.images.elf import needed, prune_unlinked

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")


def _a_library_needing_libz() -> Path:
    for candidate in sorted(LIBDIR.glob("lib*.so.*")):
        if candidate.is_file() and not candidate.is_symlink() and "libz.so.1" in needed(candidate):
            return candidate
    pytest.skip("no library here links libz.so.1")


def test_needed_reads_a_real_executable() -> None:
    assert "libc.so.6" in needed(Path("/bin/ls"))


def test_needed_of_a_non_elf_file_is_empty(tmp_path: Path) -> None:
    text = tmp_path / "x.so"
    text.write_text("not an ELF file")
    assert needed(text) == []


def test_prune_keeps_the_closure_and_drops_the_rest(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    shutil.copy(_a_library_needing_libz(), site / "torch" / "lib" / "libtorch_fake.so")
    lib = site / "nvidia" / "cu" / "lib"
    lib.mkdir(parents=True)
    shutil.copy((LIBDIR / "libz.so.1").resolve(), lib / "libz.so.1")
    (lib / "libunlinked.so.9").write_bytes(b"\x7fELF unused")
    (site / "nvidia" / "cu" / "include").mkdir()
    (site / "nvidia" / "cu" / "include" / "cuda.h").write_text("/* header */")
    (site / "nvidia" / "cu" / "__init__.py").write_text("")

    assert prune_unlinked(site, dry_run=True).keys() == {
        "nvidia/cu/include/cuda.h",
        "nvidia/cu/lib/libunlinked.so.9",
    }
    assert (lib / "libunlinked.so.9").exists()  # a dry run deletes nothing
    removed = prune_unlinked(site)
    assert set(removed) == {"nvidia/cu/include/cuda.h", "nvidia/cu/lib/libunlinked.so.9"}
    assert (lib / "libz.so.1").exists()
    assert (site / "nvidia" / "cu" / "__init__.py").exists()
    assert not (lib / "libunlinked.so.9").exists()


def test_prune_without_nvidia_packages_does_nothing(tmp_path: Path) -> None:
    assert prune_unlinked(tmp_path) == {}
