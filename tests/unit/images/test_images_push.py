"""Where a push copies from, and which builds a rebuild leaves on disk."""

from __future__ import annotations

import json
from pathlib import Path

from tensoryard.images.builder import LAYOUT_DIR, _drop_builds, archive_path, built_layout
from tensoryard.images.operate import push_source


def _layout(at: Path, *tags: str) -> None:
    at.mkdir(parents=True)
    manifests = [
        {"digest": f"sha256:{i:064x}", "annotations": {"org.opencontainers.image.ref.name": t}}
        for i, t in enumerate(tags)
    ]
    (at / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))


def test_a_build_with_its_layout_pushes_from_the_layout(tmp_path: Path) -> None:
    archive = archive_path(tmp_path, "cpu", "a" * 64)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"tar")
    _layout(archive.with_name(LAYOUT_DIR), "cpu")
    assert built_layout(archive) == f"oci:{archive.with_name(LAYOUT_DIR)}:cpu"
    assert push_source(archive) == f"oci:{archive.with_name(LAYOUT_DIR)}:cpu"


def test_without_a_layout_or_with_an_ambiguous_one_the_archive_is_pushed(tmp_path: Path) -> None:
    archive = archive_path(tmp_path, "cpu", "b" * 64)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"tar")
    assert push_source(archive) == f"oci-archive:{archive}"
    _layout(archive.with_name(LAYOUT_DIR), "cpu", "other")
    assert push_source(archive) == f"oci-archive:{archive}"
    (archive.with_name(LAYOUT_DIR) / "index.json").write_text("{not json")
    assert push_source(archive) == f"oci-archive:{archive}"


def test_a_rebuild_drops_the_other_builds_of_that_image_only(tmp_path: Path) -> None:
    old = archive_path(tmp_path, "cpu", "c" * 64).parent
    new = archive_path(tmp_path, "cpu", "d" * 64).parent
    other = archive_path(tmp_path, "postgres", "e" * 64).parent
    for d in (old, new, other):
        d.mkdir(parents=True)
        (d / "image.oci.tar").write_bytes(b"tar")
    _drop_builds(tmp_path, "cpu", keep=new)
    assert not old.exists() and new.is_dir() and other.is_dir()
    _drop_builds(tmp_path, "never-built", keep=new)  # no such image yet: nothing to drop
