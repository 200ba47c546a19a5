"""``python -m tensoryard.executors.local.gang PLAN``: one torchrun per node of a multi-node job,
each inside its node's network namespace (``netns.py``).

The attempt's shim starts this as the workload (its process group is the one the shim signals).
For node rank ``i`` of ``PLAN["nodes"]`` it runs::

    ip netns exec tyard-<node> python -m torch.distributed.run --nnodes N --node-rank i
        --master-addr <node 0's address> --master-port P --nproc-per-node K
        --max-restarts 0 --log-dir <torchrun dir>/node-i <rank wrapper> <attempt dir> <command>

in the same process group, with ``TYARD_NODE`` set, the control plane's URL moved from loopback
to the bridge address (loopback inside a namespace is the namespace's own), and gloo/NCCL told
to use ``eth0``. The first node whose torchrun fails ends the gang: the others get SIGTERM (and
SIGKILL 10 s later) and this process exits with that node's code; 0 when every node succeeded.
A SIGTERM to this process (a cancel) is passed on to every node's torchrun.

With in-place restarts granted (``PLAN["max_restarts"]`` > 0) the torchruns rendezvous with
c10d at node 0's address instead (``--rdzv-backend c10d``, node 0's agent hosting the store) and
get ``--max-restarts``: a failed worker makes its agent re-rendezvous, the other agents see the
waiting node and restart their workers too, and the whole gang runs again in the same launch.
Each restarted round is numbered the same on every node by the rank wrapper (rank.py), which
torchrun's own restart count is not (it grows only on the node whose worker failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

from tensoryard import envvars

__all__ = ["gang_argv", "main"]

_TERM_GRACE_S = 10.0


def gang_argv(python: str, plan: dict[str, Any]) -> list[str]:
    """The workload's argv for ``plan`` (see :func:`main` for its keys)."""
    return [python, "-m", "tensoryard.executors.local.gang", json.dumps(plan, sort_keys=True)]


def _node_env(plan: dict[str, Any], node: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env[envvars.NODE.name] = str(node["name"])
    env[envvars.GANG.name] = "1"  # the rank wrapper numbers in-place restarts by round (rank.py)
    url = env.get(envvars.SERVER_URL.name)
    if url:
        for local in ("//127.0.0.1:", "//localhost:", "//[::1]:"):
            url = url.replace(local, f"//{plan['host_ip']}:")
        env[envvars.SERVER_URL.name] = url
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        env.setdefault(var, "eth0")
    return env


def _node_argv(plan: dict[str, Any], rank: int, node: dict[str, Any]) -> list[str]:
    restarts = int(plan.get("max_restarts", 0))
    if restarts > 0:
        # In-place restarts: c10d rendezvous, hosted by node 0's agent. When one node's
        # worker fails, its agent re-rendezvouses and every other agent sees the waiting
        # node and restarts its own workers too: the gang restarts together, in place.
        # (Node ranks then follow arrival order; TYARD_NODE says which node a rank is on.)
        rendezvous = [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{plan['nodes'][0]['ip']}:{plan['master_port']}",
            "--rdzv-id",
            str(plan.get("rdzv_id", "tyard")),
            "--rdzv-conf",
            f"is_host={'true' if rank == 0 else 'false'}",
            # the address its peers reach it at (MASTER_ADDR of the workers when it is rank
            # 0): the host name would resolve to no namespace's address
            "--local-addr",
            str(node["ip"]),
        ]
    else:  # static: the first failure ends the gang (the control plane restarts it)
        rendezvous = [
            "--node-rank",
            str(rank),
            "--master-addr",
            str(plan["nodes"][0]["ip"]),
            "--master-port",
            str(plan["master_port"]),
        ]
    return [
        "ip", "netns", "exec", str(node["netns"]),
        str(plan["python"]), "-m", "torch.distributed.run",
        "--nnodes", str(len(plan["nodes"])),
        *rendezvous,
        "--nproc-per-node", str(plan["procs"]),
        "--max-restarts", str(restarts),
        "--log-dir", f"{plan['log_dir']}/node-{rank}",
        *[str(a) for a in plan["program"]],
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tensoryard.executors.local.gang PLAN_JSON", file=sys.stderr)
        return 2
    plan = json.loads(args[0])
    children: list[subprocess.Popen[bytes]] = []
    stopping = {"at": 0.0}

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping["at"] = stopping["at"] or time.monotonic()
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for rank, node in enumerate(plan["nodes"]):
        children.append(subprocess.Popen(_node_argv(plan, rank, node), env=_node_env(plan, node)))
        print(
            f"[gang] node {rank} ({node['name']}, {node['ip']}): pid {children[-1].pid}", flush=True
        )
    failed: tuple[int, int] | None = None
    while True:
        codes = [c.poll() for c in children]
        if failed is None:
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                print(
                    f"[gang] node {failed[0]} ({plan['nodes'][failed[0]]['name']}) exited with "
                    f"{failed[1]}: stopping the other nodes",
                    flush=True,
                )
                forward(signal.SIGTERM, None)
        if all(c is not None for c in codes):
            break
        if stopping["at"] and time.monotonic() - stopping["at"] > _TERM_GRACE_S:
            for child in children:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.1)
    if failed is not None:
        return _status(failed[1])
    return next((_status(c.returncode) for c in children if c.returncode), 0)


def _status(code: int) -> int:
    """An exit status for a child's return code (killed by signal N: 128 + N, like a shell)."""
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
