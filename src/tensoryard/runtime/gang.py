"""In-place restarts of a multi-node gang where each node is its own pod (Kubernetes).

A gang that may restart its workers in place runs torchrun with the c10d rendezvous (the
static one cannot start a second round) and a per-worker round counter. Two commands, used by
the pod spec the Kubernetes executor renders (executors/kubernetes/manifests.py):

``python -m tensoryard.runtime.gang launch -- torchrun ARGS...``
    Adds ``--rdzv-conf=is_host=true`` on node 0 (``NODE_RANK``, from the pod's completion
    index) and ``false`` elsewhere, then becomes torchrun. torchrun guesses whether it hosts
    the rendezvous store by comparing the endpoint with the machine's names, and a pod's
    ``POD.SUBDOMAIN`` endpoint matches neither its host name nor its FQDN, so every pod would
    wait for a store nobody hosts.

``python -m tensoryard.runtime.gang round -- COMMAND...``
    Run by torchrun for each worker (``--no-python``). torchrun's TORCHELASTIC_RESTART_COUNT
    grows only on the node whose worker failed (the others restart theirs for the new round
    without counting), so the nodes would disagree on the restart number. Every round starts
    every local rank of every node once, so the starts of this local rank, counted in a
    pod-local directory, are the round on every node alike: round k runs as attempt L + k
    (``TYARD_ATTEMPT``, with ``TYARD_LAUNCH_ATTEMPT`` = L and ``TYARD_RESTART_ROUND`` = k, as
    the local executor's rank wrapper sets them), then the command replaces this process.

Standard library only; the job's image needs tensoryard installed for these (as for the
runtime itself).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensoryard import envvars

__all__ = ["ROUNDS_DIR_ENV", "claim_round", "launch_argv", "main", "round_env"]

ROUNDS_DIR_ENV = envvars.ROUNDS_DIR.name
"""Where the round markers live (pod-local; default: a directory under /tmp per attempt)."""

USAGE = (
    "usage: python -m tensoryard.runtime.gang launch -- torchrun ARGS...\n"
    "       python -m tensoryard.runtime.gang round -- COMMAND..."
)


def launch_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """torchrun's command line with the c10d store hosted by node 0 (NODE_RANK)."""
    node_rank = env.get("NODE_RANK", "").strip()
    if not node_rank.isdigit():
        raise ValueError(
            f"NODE_RANK={node_rank!r}: launch needs this pod's node rank (0, 1, ...) in NODE_RANK"
        )
    host = "true" if int(node_rank) == 0 else "false"
    if any(a.startswith(("--rdzv-conf", "--rdzv_conf")) for a in argv):
        raise ValueError("--rdzv-conf is set by launch (is_host from NODE_RANK): leave it out")
    # next to the rendezvous backend: among torchrun's own options, before the script
    at = next(
        (i for i, a in enumerate(argv) if a.startswith(("--rdzv-backend", "--rdzv_backend"))), None
    )
    if at is None:
        raise ValueError("launch is for torchrun with --rdzv-backend=c10d: none in the command")
    return [*argv[:at], f"--rdzv-conf=is_host={host}", *argv[at:]]


def claim_round(folder: Path) -> int:
    """The number of earlier starts recorded in `folder`, claiming the next one (O_EXCL: two
    starts never get the same number)."""
    folder.mkdir(parents=True, exist_ok=True)
    taken = 0
    while True:
        try:
            os.close(os.open(folder / str(taken), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            taken += 1
            continue
        return taken


def _private_dir(name: str) -> Path:
    """A directory of this user's own under the temp dir (never a shared /tmp name another user
    could own first): tyard-<uid>/<name>, the parent made 0700."""
    parent = Path(tempfile.gettempdir()) / f"tyard-{os.getuid()}"
    parent.mkdir(mode=0o700, exist_ok=True)
    if parent.stat().st_uid != os.getuid() or parent.is_symlink():
        raise RuntimeError(f"{parent} is not this user's own directory (fix: remove it)")
    return parent / name


def round_env(env: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment for this start: its round, and the attempt it reports as."""
    key = "".join(
        c if c.isalnum() or c in "-_." else "_" for c in env.get(envvars.ATTEMPT_KEY.name, "")
    )
    base = Path(env.get(ROUNDS_DIR_ENV) or _private_dir(f"rounds-{key or 'job'}"))
    round_ = claim_round(base / env.get("LOCAL_RANK", "0"))
    out = {**env, envvars.RESTART_ROUND.name: str(round_)}
    launch = env.get(envvars.ATTEMPT.name, "")
    if round_ > 0 and launch.isdigit() and int(launch) > 0:
        out[envvars.ATTEMPT.name] = str(int(launch) + round_)
        out[envvars.LAUNCH_ATTEMPT.name] = launch
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in ("launch", "round") or args[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    what, command = args[0], args[2:]
    try:
        if what == "launch":
            argv_ = launch_argv(command, os.environ)
            env = dict(os.environ)
        else:
            argv_, env = command, round_env(os.environ)
        sys.stdout.flush()
        os.execvpe(argv_[0], argv_, env)
    except (OSError, ValueError) as exc:
        print(f"tensoryard.runtime.gang {what}: {exc}", file=sys.stderr)
        return 127 if isinstance(exc, OSError) else 2
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
