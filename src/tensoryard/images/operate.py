"""Host-side operations on built images: check one in its rootfs, push one, resolve a manifest.

* :func:`check_in_rootfs` runs ``tyard images check --inside`` chrooted into the image's
  unpacked rootfs as its non-root user (private mount and PID namespaces, /proc, /dev and a
  private /tmp mounted), with the image's environment, when no container runtime is at hand.
* :func:`push` copies the image (its OCI layout, else its archive) to a registry (or any
  skopeo destination) with skopeo.
* :func:`resolve_manifest` reads what the pinned torch wheel in the wheelhouse actually pins
  (its METADATA and version.py) and checks it against the matrix entry and the compatibility
  table, without building: what CI does for the CUDA images.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

from tensoryard.images.builder import (
    IMAGE_JSON,
    USER_ID,
    VENV,
    ImageBuildError,
    _find_wheel,
    _wheel_requires,
    built_layout,
    cache_root,
    find_built,
)
from tensoryard.images.compat import incompatibilities
from tensoryard.images.matrix import ImageEntry
from tensoryard.images.refs import validate_image_ref

__all__ = [
    "built_archive",
    "built_rootfs",
    "check_in_rootfs",
    "push",
    "push_destination",
    "push_source",
    "resolve_manifest",
]

CHECK_TIMEOUT_S = 600


def built_archive(name: str, root: Path | None = None) -> Path:
    """The OCI archive of a built image (a matrix image or `postgres`)."""
    record = find_built(name, root)
    if record is None or not Path(record["archive"]).is_file():
        raise ImageBuildError(f"image {name!r} is not built here; run `tyard images build {name}`")
    return Path(record["archive"])


def built_rootfs(name: str, root: Path | None = None) -> tuple[dict[str, Any], Path]:
    record = find_built(name, root)
    if record is None:
        raise ImageBuildError(f"image {name!r} is not built here; run `tyard images build {name}`")
    rootfs = Path(record["archive"]).with_name("rootfs")
    if not (rootfs / IMAGE_JSON.lstrip("/")).is_file():
        raise ImageBuildError(f"the rootfs of {name!r} is missing ({rootfs}); rebuild with --force")
    return record, rootfs


def check_in_rootfs(rootfs: Path) -> list[dict[str, Any]]:
    """Run the in-image check in ``rootfs``; its findings (``tyard images check --json``)."""
    manifest = json.loads((rootfs / IMAGE_JSON.lstrip("/")).read_text())
    env = {
        "PATH": f"{VENV}/bin:/usr/bin:/bin",
        "HOME": "/home/tyard",
        "LANG": "C.UTF-8",
        **manifest.get("env_defaults", {}),
    }
    env_args = " ".join(f"'{k}={v}'" for k, v in env.items())
    script = "\n".join(
        [
            "set -e",
            f"mount -t proc proc '{rootfs}/proc'",
            f"mount --rbind /dev '{rootfs}/dev'",
            f"mount -t tmpfs -o mode=1777 tmpfs '{rootfs}/tmp'",
            f"exec chroot --userspec={USER_ID}:{USER_ID} '{rootfs}' /usr/bin/env -i {env_args} "
            f"{VENV}/bin/tyard images check --inside --json",
        ]
    )
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        raise ImageBuildError("checking an image here needs unshare and chroot (util-linux)")
    cmd = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "sh", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        return list(json.loads(last[0])["findings"]) if last else []
    except (ValueError, KeyError, IndexError):
        pass
    raise ImageBuildError(
        f"the check did not run in {rootfs} (exit {proc.returncode}):\n"
        + (proc.stderr or proc.stdout)[-1500:]
    )


def push_destination(name: str, registry: str, version: str) -> str:
    """A skopeo destination: a registry prefix becomes docker://REGISTRY/NAME:VERSION; a
    transport (docker://, oci:, oci-archive:, dir:) is used as given."""
    if re.match(r"^(docker|oci|oci-archive|dir|docker-archive)(://|:)", registry):
        return registry
    ref = f"{registry.rstrip('/')}/{name}:{version}"
    validate_image_ref(ref, field="REGISTRY")
    return f"docker://{ref}"


def push_source(archive: Path) -> str:
    """What ``push`` copies from: the OCI layout kept beside the archive where the build left
    one (skopeo copies its blobs as they are), else the archive, which skopeo first unpacks whole
    into TMPDIR (as much free space there as the archive's size)."""
    return built_layout(archive) or f"oci-archive:{archive}"


def push(
    archive: Path, destination: str, *, tls_verify: bool = True, cert_dir: Path | None = None
) -> str:
    """Copy ``archive`` to ``destination`` with skopeo; ``cert_dir`` holds the registry's CA
    (``*.crt``) and client certificates where its TLS is signed by a CA of the site's own."""
    if shutil.which("skopeo") is None:
        raise ImageBuildError("pushing needs skopeo (Debian: apt-get install skopeo)")
    if cert_dir is not None and not cert_dir.is_dir():
        raise ImageBuildError(
            f"--cert-dir {cert_dir}: no such directory (fix: a directory holding the "
            "registry's CA as ca.crt)"
        )
    cmd = ["skopeo", "copy", "--quiet"]
    if destination.startswith("docker://"):
        cmd.append(f"--dest-tls-verify={'true' if tls_verify else 'false'}")
        if cert_dir is not None:
            cmd.append(f"--dest-cert-dir={cert_dir}")
    source = push_source(archive)
    cmd += [source, destination]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        why = proc.stderr.strip()
        if "no space left on device" in why and source.startswith("oci-archive:"):
            why += (
                " (skopeo unpacks the archive into TMPDIR first: free as much space there as the"
                " archive's size, point TMPDIR at a larger disk, or rebuild the image with"
                " `tyard images build --force` to keep its OCI layout, which pushes without it)"
            )
        raise ImageBuildError(f"skopeo could not push to {destination}: {why}")
    return destination


def resolve_manifest(entry: ImageEntry, wheels: Path | None = None) -> dict[str, Any]:
    """What the entry's torch wheel pins, next to the matrix, with every disagreement."""
    wheels = wheels or cache_root() / "wheels"
    out: dict[str, Any] = {"name": entry.name, "entry": entry.as_dict(), "problems": []}
    combo = entry.combination()
    if combo is not None:
        out["problems"] += incompatibilities(combo)
    if entry.torch is None:
        return out
    try:
        wheel = _find_wheel(wheels, "torch", entry.torch)
    except ImageBuildError:
        out["problems"].append(
            f"torch {entry.torch}'s wheel is not in {wheels}; "
            f"run `pip download --no-deps torch=={entry.torch} -d {wheels}` or build an image "
            "with that torch"
        )
        return out
    pins = {r.name: str(r.specifier) for r in _wheel_requires(wheel)}
    with zipfile.ZipFile(wheel) as archive:
        version_py = archive.read("torch/version.py").decode()
    cuda = re.search(r"cuda: Optional\[str\] = '([\d.]+)'", version_py)
    resolved = {
        "wheel": wheel.name,
        "cuda": cuda.group(1) if cuda else None,
        "nccl": _pinned(pins, "nvidia-nccl"),
        "cudnn": _pinned(pins, "nvidia-cudnn"),
        "requires": pins,
    }
    out["resolved"] = resolved
    out["problems"] += _disagreements(entry, resolved)
    return out


def _pinned(pins: dict[str, str], prefix: str) -> str | None:
    for name, spec in pins.items():
        if name.startswith(prefix) and spec.startswith("=="):
            return spec[2:]
    return None


def _disagreements(entry: ImageEntry, resolved: dict[str, Any]) -> list[str]:
    problems = []
    if entry.cuda is not None and resolved["cuda"] != entry.cuda:
        problems.append(
            f"the torch {entry.torch} wheel is built for CUDA {resolved['cuda']}, the matrix says "
            f"{entry.cuda}: PyPI carries one CUDA build per release; set cuda: {resolved['cuda']}"
        )
    for field in ("nccl", "cudnn"):
        declared = getattr(entry, field)
        if declared is not None and resolved[field] != declared:
            problems.append(
                f"the torch {entry.torch} wheel pins {field} {resolved[field]}, "
                f"the matrix says {declared}"
            )
    for name in entry.prune:
        if name not in resolved["requires"]:
            problems.append(f"prune: torch {entry.torch} does not require {name}")
    return problems
