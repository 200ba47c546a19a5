"""A matrix image: tensoryard's build against a plain ``pip install`` image of the same packages.

    python benchmarks/image_build.py [--image NAME] [--json PATH] [--no-results-line]

NAME is a matrix entry (default ``cpu``; ``pytorch-2.13-cu130`` is the CUDA image, built here
only by this explicit command).

Both arms start from the same cached Debian base (debootstrap minbase + Python) and the same
wheelhouse, so neither pays for debootstrap or downloads, and both pack with umoci and write an
OCI archive with skopeo:

* tensoryard: ``tensoryard.images.builder.build`` of the entry, its cache root fresh (base and
  wheelhouse linked in): three layers, the entry's pruning (the CPU image drops triton,
  cuda-bindings and the CUDA libraries torch does not link), fixed mtimes, unchecked-hash bytecode;
* plain: what a Dockerfile ``RUN pip install torch==2.13.0 tensoryard[...] <layers>`` gives: the
  base layer plus one layer of ``pip install`` with every dependency (pip's own bytecode).

Reports build time, archive size (compressed) and rootfs size of each, and the ratios. Needs
root, debootstrap, umoci and skopeo. Writes benchmarks/results/image_build.json and its
RESULTS.md row (``image_build-NAME.json`` and the row ``image_build (NAME)`` for another image).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _results import write_results_line  # noqa: E402

from tensoryard.images.builder import (  # noqa: E402
    VENV,
    _chroot_script,
    _Log,
    _source_hash,
    base_rootfs,
    build,
    cache_root,
    find_built,
    find_source,
    new_image,
    plan,
    tensoryard_wheel,
)
from tensoryard.images.matrix import default_matrix  # noqa: E402

COMMAND = "python benchmarks/image_build.py"


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def tensoryard_arm(shared: Path, work: Path, name: str) -> dict[str, Any]:
    root = work / "tensoryard-cache"
    root.mkdir()
    for part in ("base", "wheels", "tensoryard-wheels"):
        (root / part).symlink_to(shared / part)
    earlier = find_built(name, shared)  # the same inputs built before in the shared cache
    started = time.monotonic()
    result = build(default_matrix().get(name), root=root, force=True)
    seconds = time.monotonic() - started
    rootfs = Path(result.archive).with_name("rootfs")
    return {
        "build_s": round(seconds, 1),
        "archive_bytes": result.archive_bytes,
        "rootfs_bytes": _du(rootfs),
        "layers": len(result.layers),
        "packages": result.packages,
        "layer_digests": result.layers,
        "earlier_layer_digests": earlier["layers"] if earlier else None,
        # Same inputs, same layers? Compared with the shared cache's build of the same key.
        "same_layers_as_earlier_build": (
            earlier["layers"] == result.layers if earlier and earlier["key"] == result.key else None
        ),
    }


def plain_arm(shared: Path, work: Path, name: str) -> dict[str, Any]:
    """Base layer + one `pip install` layer of torch and tensoryard with every dependency."""
    entry = default_matrix().get(name)
    log = _Log(work / "plain.log")
    source = find_source(ROOT)
    tyard = tensoryard_wheel(source, shared, _source_hash(source), log)
    base = base_rootfs(default_matrix().debian, shared, log)
    # The same packages without pruning, all in the wheelhouse.
    planned = plan(dataclasses.replace(entry, prune=()), shared / "wheels", tyard, log)
    layers = [r for r in planned.requirements if r.split("==")[0].split("[")[0] in _layer_names()]
    started = time.monotonic()
    (work / "plain").mkdir(parents=True, exist_ok=True)
    tagged, bundle, rootfs = new_image(work / "plain", "plain", base, log)
    log.run(["umoci", "repack", "--refresh-bundle", "--image", tagged, str(bundle)])
    extras = ",".join(entry.extras)
    script = (
        f"python3 -m venv {VENV}; {VENV}/bin/pip install -q --no-index --find-links /wheels "
        f"torch=={entry.torch} '/tyard/{tyard.name}[{extras}]' {' '.join(layers)}"
    ).replace("'", "")
    _chroot_script(rootfs, {"/wheels": shared / "wheels", "/tyard": tyard.parent}, script, log)
    log.run(["umoci", "repack", "--image", tagged, str(bundle)])
    archive = work / "plain.oci.tar"
    log.run(["skopeo", "copy", "--quiet", f"oci:{tagged}", f"oci-archive:{archive}:plain:1"])
    seconds = time.monotonic() - started
    return {
        "build_s": round(seconds, 1),
        "archive_bytes": archive.stat().st_size,
        "rootfs_bytes": _du(rootfs),
        "layers": 2,
    }


def _layer_names() -> set[str]:
    from tensoryard.images.matrix import LAYERS

    return {spec.split("[")[0] for spec in LAYERS.values()}


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="cpu", help="matrix entry (default cpu)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-results-line", action="store_true")
    args = parser.parse_args()
    name = args.image
    entry = default_matrix().get(name)
    suffix = "" if name == "cpu" else f"-{name}"
    json_path = args.json or ROOT / f"benchmarks/results/image_build{suffix}.json"
    shared = cache_root()
    work = Path(tempfile.mkdtemp(prefix="image-bench-", dir=shared))
    try:
        plain = plain_arm(shared, work, name)
        ours = tensoryard_arm(shared, work, name)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    ratios = {
        "archive_tensoryard_over_plain": round(ours["archive_bytes"] / plain["archive_bytes"], 3),
        "rootfs_tensoryard_over_plain": round(ours["rootfs_bytes"] / plain["rootfs_bytes"], 3),
        "build_s_tensoryard_over_plain": round(ours["build_s"] / plain["build_s"], 3),
    }
    report = {
        "command": COMMAND + ("" if name == "cpu" else f" --image {name}"),
        "image": name,
        "commit": _commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "tensoryard": ours,
        "plain": plain,
        "ratios": ratios,
        "note": "same Debian base and wheelhouse for both arms; debootstrap and downloads "
        "excluded from both times",
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    if not args.no_results_line:
        gib = 2**30
        what = (
            f"CPU image (torch {entry.torch}, tensoryard)"
            if entry.cuda is None
            else f"CUDA {entry.cuda} image {name} (torch {entry.torch}, tensoryard"
            + "".join(f", {k} {v}" for k, v in entry.layers.items())
            + ")"
        )
        result = (
            f"{what}: archive {ours['archive_bytes'] / gib:.2f} GiB "
            "vs "
            f"plain pip install {plain['archive_bytes'] / gib:.2f} GiB "
            f"({ratios['archive_tensoryard_over_plain']}x); rootfs "
            f"{ours['rootfs_bytes'] / gib:.2f} vs {plain['rootfs_bytes'] / gib:.2f} GiB "
            f"({ratios['rootfs_tensoryard_over_plain']}x); build {ours['build_s']:.0f} s vs "
            f"{plain['build_s']:.0f} s ({ratios['build_s_tensoryard_over_plain']}x; same cached "
            "base and wheelhouse, no downloads)"
        )
        met = "yes" if ratios["archive_tensoryard_over_plain"] <= 1.0 else "no"
        write_results_line(
            "image_build" if name == "cpu" else f"image_build ({name})",
            report["command"],
            result,
            f"{'CPU' if entry.cuda is None else 'CUDA'} image no larger than a plain pip install "
            "image",
            met,
        )


if __name__ == "__main__":
    main()
