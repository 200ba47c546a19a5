"""Pretend nodes as network namespaces, so that a multi-node job on one machine crosses a network.

``tyard server --local-nodes n1,n2 --node-netns`` gives each local node a network namespace
(``tyard-<node>``) with one interface, ``eth0``, a veth pair whose other end hangs off a bridge
in the root namespace:

    root namespace:  bridge tyd0  10.213.0.1/24  (the control plane also listens here)
    tyard-n1:        eth0         10.213.0.2/24  default route via 10.213.0.1
    tyard-n2:        eth0         10.213.0.3/24

A node's ranks run inside its namespace (``ip netns exec``, see ``gang.py``): torchrun's
rendezvous, the TCPStore and gloo's collectives go over the veths and the bridge, and the ranks
report to the control plane at the bridge address. Cutting a node off (``cut``: its ``eth0``
down) is a network partition its ranks really see. Needs root (CAP_NET_ADMIN) and ``ip`` from
iproute2. ``setup`` is idempotent (a restarted control plane keeps the namespaces its running
jobs use); ``teardown`` removes them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tensoryard.errors import ExecutorError

__all__ = [
    "BRIDGE",
    "HOST_IP",
    "NetnsNode",
    "NetnsNodes",
    "cut_netns",
    "netns_unavailable",
    "restore_netns",
]

BRIDGE = "tyd0"
SUBNET = "10.213.0"
HOST_IP = f"{SUBNET}.1"
IFNAME = "eth0"
NETNS_ETC = Path("/etc/netns")


@dataclass(frozen=True)
class NetnsNode:
    name: str  # the node's name (the scheduler's)
    netns: str  # its network namespace
    ip: str  # eth0's address inside it
    index: int  # its number among the local nodes (veth names)


def netns_unavailable() -> str | None:
    """Why network-namespace nodes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN): run the server as root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed (fix: apt-get install iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise ExecutorError(
            f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.stdout.strip()} "
            "(network-namespace nodes need root and iproute2)"
        )
    return done


def cut_netns(netns: str) -> None:
    """Take namespace ``netns``'s eth0 down."""
    _ip("-n", netns, "link", "set", IFNAME, "down")


def restore_netns(netns: str, host_ip: str = HOST_IP) -> None:
    """Bring ``netns``'s eth0 back up, with its default route."""
    _ip("-n", netns, "link", "set", IFNAME, "up")
    _ip("-n", netns, "route", "replace", "default", "via", host_ip)


class NetnsNodes:
    """The namespaces of the local nodes, their addresses, and the bridge joining them."""

    def __init__(self, names: Sequence[str], *, bridge: str = BRIDGE, subnet: str = SUBNET) -> None:
        if len(names) > 250:
            raise ExecutorError("at most 250 network-namespace nodes fit in one /24")
        self.bridge = bridge
        self.host_ip = f"{subnet}.1"
        self.nodes = {
            name: NetnsNode(name, f"tyard-{name}", f"{subnet}.{i + 2}", i)
            for i, name in enumerate(names)
        }

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def setup(self) -> None:
        """Create what is missing (bridge, namespaces, veths, addresses, routes)."""
        if _ip("link", "show", self.bridge, check=False).returncode != 0:
            _ip("link", "add", self.bridge, "type", "bridge")
        if f" {self.host_ip}/" not in _ip("-o", "addr", "show", "dev", self.bridge).stdout:
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        existing = set(_ip("netns", "list").stdout.split())
        for node in self.nodes.values():
            if node.netns not in existing:
                _ip("netns", "add", node.netns)
            host_end, ns_end = f"{self.bridge}v{node.index}", f"{self.bridge}p{node.index}"
            if _ip("-n", node.netns, "link", "show", IFNAME, check=False).returncode != 0:
                if _ip("link", "show", host_end, check=False).returncode == 0:
                    _ip("link", "del", host_end)  # a half-made pair from an earlier setup
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                _ip("link", "set", ns_end, "netns", node.netns)
                _ip("-n", node.netns, "link", "set", ns_end, "name", IFNAME)
                _ip("-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", IFNAME)
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
            _ip("-n", node.netns, "link", "set", IFNAME, "up")
            _ip("-n", node.netns, "route", "replace", "default", "via", self.host_ip)
            self._name_files(node)

    def _name_files(self, node: NetnsNode) -> None:
        """/etc/netns/<ns>/{hosts,resolv.conf}, which `ip netns exec` mounts over /etc: every
        node's address by name, and no name server (inside a namespace the host's is out of
        reach: torch's reverse lookups of its peers otherwise wait seconds for a timeout)."""
        folder = NETNS_ETC / node.netns
        folder.mkdir(parents=True, exist_ok=True)
        hosts = ["127.0.0.1 localhost", f"{self.host_ip} tyard-control-plane"]
        hosts += [f"{n.ip} {n.name}" for n in self.nodes.values()]
        (folder / "hosts").write_text("\n".join(hosts) + "\n")
        (folder / "resolv.conf").write_text("options timeout:1 attempts:1\n")

    def teardown(self) -> None:
        """Remove the namespaces (their veths go with them), their /etc files and the bridge."""
        for node in self.nodes.values():
            _ip("netns", "del", node.netns, check=False)
            shutil.rmtree(NETNS_ETC / node.netns, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)

    def cut(self, name: str) -> None:
        """Cut node ``name`` off the network (its eth0 down): a partition its ranks see."""
        cut_netns(self._node(name).netns)

    def restore(self, name: str) -> None:
        restore_netns(self._node(name).netns, self.host_ip)

    def _node(self, name: str) -> NetnsNode:
        try:
            return self.nodes[name]
        except KeyError:
            known = ", ".join(self.nodes)
            raise ExecutorError(f"no network-namespace node {name!r} (known: {known})") from None
