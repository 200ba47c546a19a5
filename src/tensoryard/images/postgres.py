"""The control plane's PostgreSQL as an image, built like the matrix images (no daemon).

``debootstrap --variant=minbase --include=postgresql`` (Debian's own server, the suite's
default major version), an entrypoint that creates the cluster on first start and then runs the
server in the foreground, packed with ``umoci`` as one layer and written as an OCI archive with
``skopeo``. Cached by the content hash of its inputs under CACHE/built/postgres, like
:func:`tensoryard.images.builder.build`, so `tyard images build postgres` is instant when
nothing changed.

The entrypoint (``tyard-postgres``) reads ``POSTGRES_USER`` (default ``tensoryard``),
``POSTGRES_DB`` (default the user) and ``POSTGRES_PASSWORD`` (required: connections from other
pods authenticate with SCRAM; no trust rule is ever written) and keeps the data in ``PGDATA``
(default ``/var/lib/postgresql/data``: mount a PersistentVolumeClaim there). It runs as the
image's ``postgres`` user, never root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from tensoryard import __version__
from tensoryard.images.builder import (
    DEBIAN_MIRROR,
    BuildResult,
    ImageBuildError,
    Progress,
    _check_tools,
    _drop_builds,
    _epoch,
    _layers,
    _Log,
    _repack,
    _touch_all,
    archive_path,
    cache_root,
    cached_result,
    new_image,
)
from tensoryard.images.refs import image_ref_for

__all__ = ["NAME", "PACKAGES", "build_postgres"]

NAME = "postgres"
PACKAGES = ("postgresql", "ca-certificates")
RECIPE_REVISION = 1  # bump when the recipe below changes what the image holds
ENTRYPOINT = "/usr/local/bin/tyard-postgres"
PGDATA = "/var/lib/postgresql/data"

ENTRYPOINT_SCRIPT = r"""#!/bin/sh
# tensoryard's PostgreSQL entrypoint: create the cluster on first start, then run the server.
set -eu
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
: "${PGDATA:=/var/lib/postgresql/data}"
user="${POSTGRES_USER:-tensoryard}"
db="${POSTGRES_DB:-$user}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
  echo "tyard-postgres: POSTGRES_PASSWORD is not set (fix: set it from a Secret)" >&2
  exit 78
fi
case "$user$db" in *[!A-Za-z0-9_]*)
  echo "tyard-postgres: POSTGRES_USER and POSTGRES_DB may hold only A-Z, a-z, 0-9 and _" >&2
  exit 78;;
esac
mkdir -p "$PGDATA"
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=scram-sha-256 \
    --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    sql="CREATE DATABASE $db OWNER $user;"
    echo "$sql" | "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "tyard-postgres: created the cluster in $PGDATA (user $user, database $db)"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp \
  -c max_connections="${POSTGRES_MAX_CONNECTIONS:-200}"
"""


def _key(debian: str, ref: str) -> str:
    parts = [RECIPE_REVISION, debian, DEBIAN_MIRROR, PACKAGES, ENTRYPOINT_SCRIPT, _epoch(), ref]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _postgres_uid(rootfs: Path) -> tuple[int, int]:
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "postgres":
            return int(fields[2]), int(fields[3])
    raise ImageBuildError("the postgresql package made no `postgres` user in the image")


def _rootfs(debian: str, work: Path, log: _Log) -> Path:
    target = work / "rootfs"
    log.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            debian,
            str(target),
            DEBIAN_MIRROR,
        ]
    )
    # The package's own cluster (/etc/postgresql/V/main) is never used: the entrypoint makes one
    # in PGDATA. Caches and logs of the build go too.
    for junk in ("etc/postgresql", "var/lib/postgresql", "var/cache/apt", "var/lib/apt/lists"):
        shutil.rmtree(target / junk, ignore_errors=True)
    for log_file in (target / "var" / "log").rglob("*"):
        if log_file.is_file():
            log_file.unlink()
    uid, gid = _postgres_uid(target)
    home = target / PGDATA.lstrip("/")
    home.mkdir(parents=True)
    for path in (home.parent, home):
        path.chmod(0o700)
        os.chown(path, uid, gid)
    script = target / ENTRYPOINT.lstrip("/")
    script.write_text(ENTRYPOINT_SCRIPT)
    script.chmod(0o755)
    return target


def build_postgres(
    *,
    debian: str = "bookworm",
    root: Path | None = None,
    registry: str | None = None,
    progress: Progress = lambda _: None,
    force: bool = False,
) -> BuildResult:
    """Build the PostgreSQL image into an OCI archive (cached by the hash of its inputs)."""
    started = time.monotonic()
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    ref = image_ref_for(NAME, registry=registry)
    progress("hashing the inputs")
    key = _key(debian, ref)
    out = archive_path(root, NAME, key)
    result_file = out.with_name("result.json")
    cached = None if force else cached_result(out)
    if cached is not None:
        return cached
    _check_tools()
    _drop_builds(root, NAME, keep=out.parent)  # stale once the inputs changed
    out.parent.mkdir(parents=True, exist_ok=True)
    log = _Log(out.with_name("build.log"))
    work = Path(tempfile.mkdtemp(prefix=f"build-{NAME}-", dir=root))
    try:
        progress(f"Debian {debian} with PostgreSQL (debootstrap)")
        rootfs = _rootfs(debian, work, log)
        uid, gid = _postgres_uid(rootfs)
        _touch_all(rootfs, _epoch())
        progress("packing the layer")
        (work / "image").mkdir()
        tagged, bundle, _ = new_image(work / "image", NAME, rootfs, log)
        _repack(tagged, bundle, log)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_epoch()))
        log.run(
            [
                "umoci",
                "config",
                "--image",
                tagged,
                "--no-history",
                f"--created={created}",
                "--author=tensoryard",
                "--architecture=amd64",
                "--os=linux",
                f"--config.user={uid}:{gid}",
                "--config.workingdir=/var/lib/postgresql",
                f"--config.entrypoint={ENTRYPOINT}",
                "--config.exposedports=5432/tcp",
                f"--config.volume={PGDATA}",
                f"--config.env=PGDATA={PGDATA}",
                "--config.env=LANG=C.UTF-8",
                "--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--config.label=org.opencontainers.image.title=tensoryard-postgres",
                f"--config.label=org.opencontainers.image.version={__version__}",
                f"--config.label=org.tensoryard.image.name={NAME}",
                f"--config.label=org.tensoryard.debian={debian}",
            ]
        )
        layout = work / "image" / "oci"
        log.run(["umoci", "gc", "--layout", str(layout)])
        progress("writing the OCI archive")
        out.unlink(missing_ok=True)
        log.run(["skopeo", "copy", "--quiet", f"oci:{tagged}", f"oci-archive:{out}:{ref}"])
        result = BuildResult(
            name=NAME,
            ref=ref,
            archive=str(out),
            key=key,
            cached=False,
            build_s=round(time.monotonic() - started, 1),
            archive_bytes=out.stat().st_size,
            layers=_layers(layout, NAME),
            packages=0,
        )
        result_file.write_text(json.dumps(result.as_dict(), indent=1) + "\n")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
