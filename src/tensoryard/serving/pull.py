"""``python -m tensoryard.serving.pull DIGEST DEST``: a registry version's weights into a pod.

The init container of a GPU serving pod (vLLM, SGLang on Kubernetes) runs this before the
engine starts: it pulls the version's artifact from the artifact store named by
``TYARD_ARTIFACT_STORE`` (the control plane's own store URL: S3, or a path on a volume the pod
mounts), every chunk verified, into ``DEST`` (an emptyDir the engine container mounts). It is
written under a temporary name and renamed when complete, so an interrupted pull is never
served, and a pod restarted with the volume intact does not pull again.

It prints one JSON line and writes the same JSON to the container's termination message
(``/dev/termination-log``), where the control plane reads it back from the pod's status to
report the load time: ``{"digest", "bytes", "files", "pull_s", "cached"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from tensoryard import envvars

__all__ = ["STORE_ENV", "TERMINATION_LOG", "main", "pull"]

STORE_ENV = envvars.ARTIFACT_STORE.name
TERMINATION_LOG = "/dev/termination-log"


def pull(store_url: str, digest: str, dest: Path) -> dict[str, Any]:
    """Pull ``digest`` into ``dest`` (no-op when a complete copy is there); the report."""
    from tensoryard.registry import ArtifactStore, open_blobs

    started = time.monotonic()
    artifacts = ArtifactStore(open_blobs(store_url))
    pulled = artifacts.pull_into(digest, dest)
    manifest = artifacts.manifest(digest)
    return {
        "digest": digest,
        "bytes": manifest.total_bytes,
        "files": len(manifest.files),
        "pull_s": round(time.monotonic() - started, 3) if pulled else 0.0,
        "cached": not pulled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensoryard.serving.pull",
        description="Pull a registry version's artifact (weights) into a directory, verified.",
    )
    parser.add_argument("digest", help="the artifact digest of the model version")
    parser.add_argument("dest", type=Path, help="directory to create (the engine's model dir)")
    parser.add_argument(
        "--store",
        default=envvars.ARTIFACT_STORE.get(),
        help=f"artifact store URL (default: ${STORE_ENV})",
    )
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=Path(TERMINATION_LOG),
        help="where the JSON report also goes (Kubernetes' termination message)",
    )
    args = parser.parse_args(argv)
    if not args.store:
        print(
            f"error: no artifact store (fix: set {STORE_ENV} or pass --store URL)", file=sys.stderr
        )
        return 2
    try:
        report = pull(args.store, args.digest, args.dest)
    except Exception as exc:  # the message ends up in the pod's status: keep it one line
        message = f"cannot pull {args.digest} from {args.store}: {exc}"
        print(f"error: {message}", file=sys.stderr)
        _write(args.termination_log, json.dumps({"error": message}))
        return 1
    line = json.dumps(report)
    print(line, flush=True)
    _write(args.termination_log, line)
    return 0


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # not in a pod: the printed line is the report
        path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
