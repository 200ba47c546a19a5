"""The daemonless image builder: Debian rootfs + pinned wheels -> OCI archive.

Phases of :func:`build` (each cached, so an unchanged image is not rebuilt):

1. key      the content hash of every input: the matrix entry, the tensoryard source, the
            environment defaults, the Debian suite and this recipe's revision
2. base     ``debootstrap --variant=minbase`` + python3, python3-venv, ca-certificates
            (cached per suite under CACHE/base)
3. wheels   ``pip download`` of the pinned requirements into CACHE/wheels (shared by all images)
4. bundle   ``umoci new`` + ``unpack``; the base copied in and packed as layer 1
5. install  a venv at /opt/venv (inside the rootfs, through chroot, offline from the wheelhouse),
            the non-root user, /opt/tensoryard/image.json (the resolved package list); packed as
            layer 2; every mtime set to SOURCE_DATE_EPOCH and bytecode compiled with
            ``unchecked-hash`` so that the same inputs give the same layers
6. config   user 1000:1000, PATH, the labelled environment defaults, labels
7. archive  ``skopeo copy`` to an OCI archive named REGISTRY/NAME:VERSION, which
            ``ctr -n k8s.io images import`` loads

Needs root (debootstrap, chroot, bind mounts in a private mount namespace) and Debian's
``debootstrap``, ``umoci`` and ``skopeo``. The cache root is ``~/.cache/tensoryard/images``
(``$TYARD_IMAGES_CACHE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensoryard import __version__, envvars
from tensoryard.errors import TensoryardError
from tensoryard.images.elf import prune_unlinked
from tensoryard.images.matrix import LAYERS, ImageEntry
from tensoryard.images.refs import image_ref_for

__all__ = [
    "DEFAULT_EPOCH",
    "RECIPE_REVISION",
    "BuildResult",
    "ImageBuildError",
    "build",
    "cache_root",
    "env_defaults",
    "find_built",
    "find_source",
]

RECIPE_REVISION = 2  # bump when the recipe below changes what an image holds
DEFAULT_EPOCH = 1767225600  # 2026-01-01T00:00:00Z: every file's mtime unless SOURCE_DATE_EPOCH
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
USER_ID = 1000
VENV = "/opt/venv"
IMAGE_JSON = "/opt/tensoryard/image.json"
EXAMPLES = "/opt/tensoryard/examples"  # the repository's examples/, e.g. the tiny GPT
PRUNED_JSON = "/opt/tensoryard/pruned-files.json"
LABEL = "org.tensoryard"
TOOLS = ("debootstrap", "umoci", "skopeo", "chroot", "unshare")

if TYPE_CHECKING:
    from packaging.requirements import Requirement

Progress = Callable[[str], None]


class ImageBuildError(TensoryardError):
    """An image could not be built: a missing tool, a failed step (with its log's tail)."""


@dataclass(frozen=True)
class BuildResult:
    name: str
    ref: str
    archive: str
    key: str
    cached: bool
    build_s: float
    archive_bytes: int
    layers: list[str]
    packages: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_root() -> Path:
    env = os.environ.get(envvars.IMAGES_CACHE.name)
    return Path(env) if env else Path.home() / ".cache" / "tensoryard" / "images"


def env_defaults() -> dict[str, str]:
    """NCCL/PyTorch defaults for InfiniBand clusters (``env_defaults.env`` beside this module;
    ``images/env_defaults.env`` in the repo). Set in the image config and labelled
    ``org.tensoryard.env-default.NAME``; a pod's own ``env`` overrides each."""
    values: dict[str, str] = {}
    for line in Path(__file__).with_name("env_defaults.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def find_source(start: Path | None = None) -> Path:
    """The tensoryard checkout to install into the image (its pyproject names tensoryard)."""
    candidates = [start] if start else [Path.cwd(), Path(__file__).resolve().parents[3]]
    for candidate in candidates:
        assert candidate is not None
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file() and 'name = "tensoryard"' in pyproject.read_text():
            return candidate.resolve()
    raise ImageBuildError(
        "cannot find the tensoryard source to install into the image; "
        "run from the checkout or pass --source DIR"
    )


def _source_hash(source: Path) -> str:
    digest = hashlib.sha256()
    files = [source / "pyproject.toml", source / "README.md"]
    files += sorted(p for p in (source / "src").rglob("*") if p.is_file() and _shipped(p))
    files += _example_files(source)
    for path in files:
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _shipped(path: Path) -> bool:
    return "__pycache__" not in path.parts and ".egg-info" not in str(path)


def _example_files(source: Path) -> list[Path]:
    """The examples the image ships (EXAMPLES): a job can run the tiny GPT from the image."""
    return sorted(p for p in (source / "examples").rglob("*") if p.is_file() and _shipped(p))


def _check_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(
            f"missing {', '.join(missing)}: install them "
            "(Debian: apt-get install debootstrap umoci skopeo)"
        )
    if os.geteuid() != 0:
        raise ImageBuildError("building an image needs root (debootstrap, chroot, mounts)")


class _Log:
    """Runs the build's commands, their output in one log file; a failure shows its tail."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def run(
        self, cmd: list[str], *, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)
    ) -> str:
        with self.path.open("a") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            log.write(proc.stdout)
        if proc.returncode not in ok:
            tail = "\n".join(proc.stdout.splitlines()[-15:])
            raise ImageBuildError(
                f"{cmd[0]} failed (exit {proc.returncode}); log {self.path}:\n{tail}"
            )
        return proc.stdout


# ---- 1. key ----------------------------------------------------------------------------------


def build_key(entry: ImageEntry, debian: str, source: Path) -> str:
    parts = {
        "recipe": RECIPE_REVISION,
        "entry": entry.digest(),
        "debian": debian,
        "mirror": DEBIAN_MIRROR,
        "base": BASE_PACKAGES,
        "env": env_defaults(),
        "source": _source_hash(source),
        "version": __version__,
        "epoch": _epoch(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


# ---- 2. base ---------------------------------------------------------------------------------


def base_rootfs(debian: str, root: Path, log: _Log) -> Path:
    """A minbase Debian with Python, built once per suite and package list."""
    key = hashlib.sha256(json.dumps([debian, DEBIAN_MIRROR, BASE_PACKAGES]).encode()).hexdigest()
    done = root / "base" / f"{debian}-{key[:16]}"
    if (done / "rootfs" / "usr" / "bin" / "python3").exists():
        return done / "rootfs"
    work = Path(tempfile.mkdtemp(prefix="base-", dir=root))
    try:
        target = work / "rootfs"
        log.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                debian,
                str(target),
                DEBIAN_MIRROR,
            ]
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for child in (target / junk).glob("*"):
                if child.is_file():
                    child.unlink()
        done.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(done, ignore_errors=True)
        work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done / "rootfs"


# ---- 3. wheels -------------------------------------------------------------------------------


def _wheel_requires(wheel: Path, extras: Iterable[str] = ()) -> list[Requirement]:
    """The requirements a wheel declares for Linux x86_64 CPython 3.11 with ``extras``."""
    from packaging.requirements import Requirement  # the `images` extra; only builds need it

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    wanted = ["", *extras]
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
            req.marker = None
            out.append(req)
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _find_wheel(wheels: Path, name: str, version: str) -> Path:
    prefix = f"{_canonical(name).replace('-', '_')}-{version}-"
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(prefix))
    if not found:
        raise ImageBuildError(f"no wheel {name} {version} in {wheels}")
    return found[0]


def _pip(args: list[str], log: _Log) -> None:
    log.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"])


def tensoryard_wheel(source: Path, root: Path, source_hash: str, log: _Log) -> Path:
    out = root / "tensoryard-wheels" / source_hash[:16]
    found = list(out.glob("tensoryard-*.whl")) if out.is_dir() else []
    if found:
        return found[0]
    work = Path(tempfile.mkdtemp(prefix="wheel-", dir=root))
    try:
        # A copy: building in the checkout would leave build/ and egg-info behind.
        copy = work / "src"
        shutil.copytree(
            source,
            copy,
            ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"),
        )
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(_epoch()))
        log.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-q",
                "-w",
                str(work / "out"),
                str(copy),
            ],
            env=env,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        (work / "out").rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return next(out.glob("tensoryard-*.whl"))


@dataclass(frozen=True)
class Plan:
    """What goes into the venv: ``no_deps`` wheels (torch) and ``requirements`` with their
    dependencies (the deps layer), then tensoryard's own wheel without dependencies (the app
    layer, so a change to tensoryard repacks only a small layer)."""

    no_deps: list[Path]
    requirements: list[str]
    tensoryard: Path

    def digest(self) -> str:
        names = [p.name for p in self.no_deps] + self.requirements
        return hashlib.sha256(json.dumps(names).encode()).hexdigest()


def plan(entry: ImageEntry, wheels: Path, tyard_wheel: Path, log: _Log) -> Plan:
    """Download what the entry needs into the wheelhouse; say what to install."""
    wheels.mkdir(parents=True, exist_ok=True)
    no_deps: list[Path] = []
    requirements: list[str] = []
    pruned = {_canonical(p) for p in entry.prune}
    if entry.torch is not None:
        if not list(wheels.glob(f"torch-{entry.torch}-*.whl")):
            args = ["download", "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
            _pip([*args, f"torch=={entry.torch}"], log)
        torch_wheel = _find_wheel(wheels, "torch", entry.torch)
        no_deps.append(torch_wheel)
        requirements += [
            str(r) for r in _wheel_requires(torch_wheel) if _canonical(r.name) not in pruned
        ]
    requirements += [
        str(r) for r in _wheel_requires(tyard_wheel, entry.extras) if _canonical(r.name) != "torch"
    ]
    requirements += [f"{LAYERS[layer]}=={version}" for layer, version in entry.layers.items()]
    marker = wheels / ".resolved" / hashlib.sha256(json.dumps(requirements).encode()).hexdigest()
    if not marker.exists():  # the same requirements were downloaded before: no index queries
        _pip(["download", "--only-binary=:all:", "-d", str(wheels), *requirements], log)
        marker.parent.mkdir(exist_ok=True)
        marker.write_text("\n".join(requirements) + "\n")
    return Plan(no_deps=no_deps, requirements=requirements, tensoryard=tyard_wheel)


# ---- 4-5. bundle, install --------------------------------------------------------------------


def _touch_all(rootfs: Path, epoch: int) -> None:
    """Every path's mtime to ``epoch`` (links themselves, not their targets)."""
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), (epoch, epoch), follow_symlinks=False)
    os.utime(rootfs, (epoch, epoch))


# Python run during the build writes no bytecode: a .pyc it wrote would carry the time of the
# build (timestamp-based), and compileall would keep it as up to date.
CHROOT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _chroot_script(rootfs: Path, mounts: dict[str, Path], script: str, log: _Log) -> None:
    """Run ``script`` (sh) chrooted in ``rootfs``, host paths bind-mounted read-only, in a
    private mount namespace (so nothing stays mounted after it exits)."""
    lines = ["set -e"]
    for inside, host in mounts.items():
        target = rootfs / inside.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        lines.append(f"mount --bind '{host}' '{target}' && mount -o remount,bind,ro '{target}'")
    lines.append(f"mount -t proc proc '{rootfs / 'proc'}'")
    lines.append(f"exec chroot '{rootfs}' /bin/sh -ec '{script}'")
    log.run(
        ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", "\n".join(lines)],
        env=CHROOT_ENV,
    )
    for inside in mounts:
        (rootfs / inside.lstrip("/")).rmdir()


def _add_user(rootfs: Path) -> None:
    etc = rootfs / "etc"
    with (etc / "passwd").open("a") as f:
        f.write(f"tyard:x:{USER_ID}:{USER_ID}:tensoryard:/home/tyard:/bin/bash\n")
    with (etc / "group").open("a") as f:
        f.write(f"tyard:x:{USER_ID}:\n")
    if (etc / "shadow").exists():
        with (etc / "shadow").open("a") as f:
            f.write("tyard:!:19000:0:99999:7:::\n")
    home = rootfs / "home" / "tyard"
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, USER_ID, USER_ID)


def install_deps(rootfs: Path, wheels: Path, the_plan: Plan, log: _Log) -> None:
    """The venv with every dependency, offline from the wheelhouse."""
    pip = f"{VENV}/bin/pip install -q --no-index --find-links /wheels --no-compile"
    reqs = " ".join(f'"{r}"' for r in the_plan.requirements).replace("'", "")
    steps = [f"python3 -m venv {VENV}"]
    if the_plan.no_deps:
        steps.append(f"{pip} --no-deps " + " ".join(f"/wheels/{p.name}" for p in the_plan.no_deps))
    steps += [f"{pip} {reqs}", f"rm -rf $HOME/.cache {VENV}/share/man"]
    _chroot_script(rootfs, {"/wheels": wheels}, "; ".join(steps), log)


def install_app(rootfs: Path, the_plan: Plan, log: _Log, source: Path | None = None) -> None:
    """tensoryard itself (no dependencies: they are in the deps layer), the user, and the
    repository's examples under EXAMPLES (read-only to the user)."""
    pip = f"{VENV}/bin/pip install -q --no-index --no-compile --no-deps"
    script = f"{pip} /tyard/{the_plan.tensoryard.name}; rm -rf $HOME/.cache"
    _chroot_script(rootfs, {"/tyard": the_plan.tensoryard.parent}, script, log)
    _add_user(rootfs)
    if source is not None:
        examples = source / "examples"
        for path in _example_files(source):
            target = rootfs / EXAMPLES.lstrip("/") / path.relative_to(examples)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copyfile(path, target)
            target.chmod(0o644)


def record(entry: ImageEntry, rootfs: Path, ref: str, log: _Log) -> dict[str, Any]:
    """/opt/tensoryard/image.json: the entry, the resolved Python and Debian packages."""
    pip_list = log.run(
        [
            "chroot",
            str(rootfs),
            f"{VENV}/bin/python",
            "-m",
            "pip",
            "list",
            "--format=json",
            "--disable-pip-version-check",
        ],
        env=CHROOT_ENV,
    )
    debs = log.run(
        ["chroot", str(rootfs), "dpkg-query", "-W", "-f=${Package}=${Version}\\n"], env=CHROOT_ENV
    )
    python_packages = {p["name"]: p["version"] for p in json.loads(pip_list.strip() or "[]")}
    manifest = {
        "name": entry.name,
        "ref": ref,
        "tensoryard": __version__,
        "entry": entry.as_dict(),
        "env_defaults": env_defaults(),
        "python_packages": dict(sorted(python_packages.items(), key=lambda kv: kv[0].lower())),
        "debian_packages": sorted(line for line in debs.splitlines() if line),
        "pruned": list(entry.prune),
        "pruned_files": _pruned_files(rootfs),
    }
    path = rootfs / IMAGE_JSON.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _pruned_files(rootfs: Path) -> dict[str, int]:
    path = rootfs / PRUNED_JSON.lstrip("/")
    if not path.exists():
        return {}
    removed: dict[str, int] = json.loads(path.read_text())
    return {"files": len(removed), "bytes": sum(removed.values())}


def _compile(rootfs: Path, log: _Log, path: str = VENV) -> None:
    """Bytecode that does not depend on mtimes (pip's would go stale once mtimes are fixed);
    forced, so that no timestamp-based .pyc survives."""
    log.run(
        [
            "chroot",
            str(rootfs),
            f"{VENV}/bin/python",
            "-m",
            "compileall",
            "-q",
            "-f",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            path,
        ],
        env=CHROOT_ENV,
        ok=(0, 1),  # 1: a file that does not compile (torch ships Python 3.12-only tests); as pip
    )


# ---- 6. config -------------------------------------------------------------------------------


def configure(layout: str, entry: ImageEntry, manifest: dict[str, Any], log: _Log) -> None:
    epoch = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_epoch()))
    labels = {
        "org.opencontainers.image.title": f"tensoryard-{entry.name}",
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.description": entry.description,
        f"{LABEL}.image.name": entry.name,
        f"{LABEL}.image.flavour": entry.flavour,
        f"{LABEL}.python": entry.python,
        f"{LABEL}.torch": entry.torch or "",
        f"{LABEL}.cuda": entry.cuda or "",
        f"{LABEL}.nccl": entry.nccl or "",
        f"{LABEL}.min-driver": entry.min_driver or "",
        f"{LABEL}.sbom": IMAGE_JSON,
        f"{LABEL}.python-packages": ",".join(
            f"{k}=={v}" for k, v in manifest["python_packages"].items()
        ),
    }
    env = {
        "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/home/tyard",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    env |= env_defaults()
    labels |= {f"{LABEL}.env-default.{k}": v for k, v in env_defaults().items()}
    cmd = [
        "umoci",
        "config",
        "--image",
        layout,
        "--no-history",
        f"--created={epoch}",
        "--author=tensoryard",
        "--architecture=amd64",
        "--os=linux",
        f"--config.user={USER_ID}:{USER_ID}",
        "--config.workingdir=/home/tyard",
        "--clear=config.cmd",
        "--config.cmd=tyard",
        "--config.cmd=images",
        "--config.cmd=check",
        "--config.cmd=--inside",
    ]
    cmd += [f"--config.env={k}={v}" for k, v in env.items()]
    cmd += [f"--config.label={k}={v}" for k, v in labels.items()]
    log.run(cmd)


# ---- the whole build -------------------------------------------------------------------------


LAYOUT_DIR = "oci"  # the OCI layout kept beside a build's archive


def archive_path(root: Path, name: str, key: str) -> Path:
    return root / "built" / name / key[:16] / "image.oci.tar"


def cached_result(out: Path) -> BuildResult | None:
    """The build record beside the archive ``out`` when both exist (a cache hit), else None."""
    result_file = out.with_name("result.json")
    if not (result_file.exists() and out.exists()):
        return None
    return BuildResult(**(json.loads(result_file.read_text()) | {"cached": True}))


def find_built(name: str, root: Path | None = None) -> dict[str, Any] | None:
    """The newest build record of a matrix image (``result.json``), or None."""
    base = (root or cache_root()) / "built" / name
    records = sorted(base.glob("*/result.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(records[-1].read_text()) if records else None


def deps_stage(
    entry: ImageEntry, debian: str, base: Path, the_plan: Plan, root: Path, log: _Log
) -> Path:
    """Layers 1 (the Debian base) and 2 (the venv with every dependency), cached as an OCI
    layout plus the unpacked umoci bundle under CACHE/stages/KEY; shared by every build whose
    dependencies are the same, whatever tensoryard's source."""
    parts = [
        RECIPE_REVISION,
        entry.digest(),
        debian,
        DEBIAN_MIRROR,
        BASE_PACKAGES,
        _epoch(),
        the_plan.digest(),
    ]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    done = root / "stages" / f"{entry.name}-{key}"
    if (done / "complete").exists():
        return done
    work = Path(tempfile.mkdtemp(prefix=f"stage-{entry.name}-", dir=root))
    try:
        tagged, bundle, rootfs = new_image(work, entry.name, base, log)
        _touch_all(rootfs, _epoch())
        _repack(tagged, bundle, log)
        install_deps(rootfs, root / "wheels", the_plan, log)
        if entry.prune_unlinked:
            site = rootfs / VENV.lstrip("/") / "lib" / f"python{entry.python}" / "site-packages"
            removed = prune_unlinked(site)
            pruned = rootfs / PRUNED_JSON.lstrip("/")
            pruned.parent.mkdir(parents=True, exist_ok=True)
            pruned.write_text(json.dumps(removed, indent=1, sort_keys=True) + "\n")
        _compile(rootfs, log)
        _touch_all(rootfs, _epoch())
        _repack(tagged, bundle, log)
        (work / "complete").write_text(json.dumps(parts) + "\n")
        shutil.rmtree(done, ignore_errors=True)
        done.parent.mkdir(parents=True, exist_ok=True)
        work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def new_image(work: Path, tag: str, base: Path, log: _Log) -> tuple[str, Path, Path]:
    """A new OCI layout under `work` whose unpacked rootfs holds a copy of the `base` rootfs:
    (the tagged image, its bundle, its rootfs), ready for a first layer."""
    layout, bundle = work / "oci", work / "bundle"
    tagged = f"{layout}:{tag}"
    log.run(["umoci", "init", "--layout", str(layout)])
    log.run(["umoci", "new", "--image", tagged])
    log.run(["umoci", "unpack", "--image", tagged, str(bundle)])
    rootfs = bundle / "rootfs"
    log.run(["cp", "-a", f"{base}/.", str(rootfs)])
    return tagged, bundle, rootfs


def _repack(tagged: str, bundle: Path, log: _Log) -> None:
    log.run(["umoci", "repack", "--no-history", "--refresh-bundle", "--image", tagged, str(bundle)])


def build(
    entry: ImageEntry,
    *,
    debian: str = "bookworm",
    source: Path | None = None,
    root: Path | None = None,
    registry: str | None = None,
    progress: Progress = lambda _: None,
    force: bool = False,
) -> BuildResult:
    """Build ``entry`` into an OCI archive (cached by the content hash of its inputs)."""
    started = time.monotonic()
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    source = find_source(source)
    ref = image_ref_for(entry.name, registry=registry)
    if entry.python != "3.11" and debian == "bookworm":
        raise ImageBuildError(
            f"{entry.name}: python {entry.python}, but Debian {debian} ships Python 3.11; "
            'set python: "3.11" or a suite that ships it'
        )
    # 1. key
    progress("hashing the inputs")
    key = build_key(entry, debian, source) + hashlib.sha256(ref.encode()).hexdigest()[:8]
    out = archive_path(root, entry.name, key)
    result_file = out.with_name("result.json")
    cached = None if force else cached_result(out)
    if cached is not None:
        return cached
    _check_tools()
    # Older builds of this image are stale once its inputs changed: dropped before this build
    # rather than after it, so that a rebuild never needs the disk of two builds at once.
    _drop_builds(root, entry.name, keep=out.parent)
    log = _Log(out.with_name("build.log"))
    work = Path(tempfile.mkdtemp(prefix=f"build-{entry.name}-", dir=root))
    try:
        # 2. base
        progress(f"Debian {debian} base (debootstrap, cached)")
        base = base_rootfs(debian, root, log)
        # 3. wheels
        progress("downloading wheels (cached in the wheelhouse)")
        tyard = tensoryard_wheel(source, root, _source_hash(source), log)
        the_plan = plan(entry, root / "wheels", tyard, log)
        # 4. layers 1-2: base and dependencies (cached stage)
        progress("base and dependency layers (cached stage)")
        stage = deps_stage(entry, debian, base, the_plan, root, log)
        _drop_stages(root, entry.name, keep=stage)
        layout, bundle = work / "oci", work / "bundle"
        log.run(["cp", "-al", str(stage / "oci"), str(layout)])
        log.run(["cp", "-a", str(stage / "bundle"), str(bundle)])
        tagged = f"{layout}:{entry.name}"
        # 5. layer 3: tensoryard, the user, the manifest
        progress("installing tensoryard (the app layer)")
        rootfs = bundle / "rootfs"
        install_app(rootfs, the_plan, log, source)
        manifest = record(entry, rootfs, ref, log)
        _compile(rootfs, log, f"{VENV}/lib/python{entry.python}/site-packages/tensoryard")
        _touch_all(rootfs, _epoch())
        progress("packing the app layer")
        _repack(tagged, bundle, log)
        # 6. config
        configure(tagged, entry, manifest, log)
        log.run(["umoci", "gc", "--layout", str(layout)])
        # 7. archive
        progress("writing the OCI archive")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        log.run(["skopeo", "copy", "--quiet", f"oci:{tagged}", f"oci-archive:{out}:{ref}"])
        result = BuildResult(
            name=entry.name,
            ref=ref,
            archive=str(out),
            key=key,
            cached=False,
            build_s=round(time.monotonic() - started, 1),
            archive_bytes=out.stat().st_size,
            layers=_layers(layout, entry.name),
            packages=len(manifest["python_packages"]),
        )
        result_file.write_text(json.dumps(result.as_dict(), indent=1) + "\n")
        # The unpacked rootfs stays beside the archive (`tyard images check` runs in it), and so
        # does the OCI layout, whose blobs are hard links into the dependency stage: `tyard
        # images push` copies from it instead of unpacking the multi-GB archive into TMPDIR.
        _keep_beside(out, rootfs=rootfs, layout=layout)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _keep_beside(out: Path, *, rootfs: Path, layout: Path) -> None:
    """Move a finished build's rootfs and OCI layout next to its archive ``out``."""
    for src, dst in ((rootfs, out.parent / "rootfs"), (layout, out.parent / LAYOUT_DIR)):
        shutil.rmtree(dst, ignore_errors=True)
        src.rename(dst)


def built_layout(archive: Path) -> str | None:
    """``oci:LAYOUT:TAG``, the OCI layout kept beside a build's ``archive`` (the same image,
    unpacked into blobs), or None where there is none (a build from before layouts were kept)."""
    layout = archive.with_name(LAYOUT_DIR)
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, ValueError):
        return None
    tags = [
        m["annotations"]["org.opencontainers.image.ref.name"]
        for m in index.get("manifests", [])
        if "org.opencontainers.image.ref.name" in m.get("annotations", {})
    ]
    return f"oci:{layout}:{tags[0]}" if len(tags) == 1 else None


def _drop_builds(root: Path, name: str, keep: Path) -> None:
    """Keep one build per image: each build of changed inputs would otherwise leave GBs behind
    (CI builds after every change to tensoryard)."""
    base = root / "built" / name
    if base.is_dir():
        for old in base.iterdir():
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)


def _drop_stages(root: Path, name: str, keep: Path) -> None:
    """Keep one dependency stage per image: the one this build uses."""
    for old in (root / "stages").glob(f"{name}-*"):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _layers(layout: Path, tag: str) -> list[str]:
    index = json.loads((layout / "index.json").read_text())
    desc = next(
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    )
    algo, digest = desc["digest"].split(":")
    manifest = json.loads((layout / "blobs" / algo / digest).read_text())
    return [layer["digest"] for layer in manifest["layers"]]
