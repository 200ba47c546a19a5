"""The nodes as the loop sees them: the executor's capacity, each node's stored cordon state
(cordon and drain come from the API, possibly on another replica), agents that fell silent
(local executor), and nodes an executor just reported lost, held closed until the capacity
view catches up."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC

from tensoryard.errors import TensoryardError
from tensoryard.executors.base import AttemptStatus
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.index import Triggers
from tensoryard.server.control.rules import CapacityProvider, NodeSync
from tensoryard.server.scheduling import NodeCapacity
from tensoryard.store import JobRecord, NodeRecord, Store

__all__ = ["LOST_NODE_HOLD_S", "NodeView"]

log = logging.getLogger("tensoryard.controller")

_NODES_READ_EVERY_S = 1.0  # cordon/drain changes come from the API; read them this often
# How long a node an executor reported lost stays closed when the capacity view never shows
# it closed (it came back at once, or the view cannot see readiness).
LOST_NODE_HOLD_S = 60.0


class NodeView:
    """Stored node states (re-read at most every second) joined to the executor's capacity."""

    def __init__(
        self,
        *,
        store: Store,
        capacity: CapacityProvider,
        config: ServerConfig,
        clock: Callable[[], float],
        triggers: Triggers,
        node_sync: NodeSync | None = None,
    ) -> None:
        self._store = store
        self._capacity = capacity
        self._config = config
        self._clock = clock
        self._triggers = triggers
        self._node_sync = node_sync
        self._states: dict[str, NodeRecord] = {}
        self._read_at = float("-inf")
        # node -> when an attempt's executor reported it lost: closed to placement until the
        # capacity view has caught up (it is cached and fed by its own watch, a moment behind).
        self._lost: dict[str, float] = {}

    def reset(self) -> None:
        """After a change of leader: read the states again, forget reported losses."""
        self._read_at = float("-inf")
        self._lost = {}

    def states(self, now: float) -> dict[str, NodeRecord]:
        """The stored node states, re-read at most every `_NODES_READ_EVERY_S`."""
        if now - self._read_at >= _NODES_READ_EVERY_S or now < self._read_at:
            previous = self._states
            self._states = {n.name: n for n in self._store.list_nodes()}
            new = [n.name for n in self._capacity() if n.name not in self._states]
            if new:  # the executor found nodes since the loop took the lead
                self._store.register_nodes(new)
                self._states = {n.name: n for n in self._store.list_nodes()}
            self._read_at = now
            if any(
                previous.get(n) is None or previous[n].state != r.state
                for n, r in self._states.items()
            ):
                self._triggers.urgent = True  # capacity appeared or vanished: schedule at once
        return self._states

    def silent(self, now: float) -> dict[str, str]:
        """node -> why, for the nodes whose agent reported once and has been silent longer
        than the agent heartbeat timeout (local executor only: Kubernetes and Slurm see their
        nodes themselves). Such a node is lost: closed to placements, its attempts ended."""
        timeout = self._config.agent_heartbeat_timeout_s
        if not timeout or self._config.executor != "local":
            return {}
        out = {}
        for name, record in self.states(now).items():
            beat = record.heartbeat_at
            if beat is not None and now - beat.timestamp() > timeout:
                since = beat.astimezone(UTC).strftime("%H:%M:%S")
                out[name] = (
                    f"node {name} lost: its agent has not reported since {since} UTC "
                    f"(--agent-heartbeat-timeout {timeout:g}s)"
                )
        return out

    def capacity(self, now: float) -> tuple[NodeCapacity, ...]:
        """The executor's capacity with each node's cordon state from the store, and the
        nodes an executor just reported lost (or whose agent fell silent) closed until the
        capacity view shows it too."""
        states = self.states(now)
        silent = self.silent(now)
        nodes = tuple(
            dataclasses.replace(n, state=states[n.name].state) if n.name in states else n
            for n in self._capacity()
        )
        if silent:
            nodes = tuple(
                dataclasses.replace(n, cordoned=True, condition=silent[n.name])
                if n.name in silent
                else n
                for n in nodes
            )
        lost = self._lost
        if not lost:
            return nodes
        seen = {n.name: n for n in nodes}
        for name, at in list(lost.items()):
            node = seen.get(name)
            if node is None or node.cordoned or now - at > LOST_NODE_HOLD_S:
                del lost[name]  # the view has it (or it is gone from the view): it decides
        return tuple(dataclasses.replace(n, cordoned=True) if n.name in lost else n for n in nodes)

    def unusable_placement(self, job: JobRecord, status: AttemptStatus) -> frozenset[str]:
        """Nodes of the job's placement that its next attempt must not use: the ones the
        executor saw lost under this attempt, and any that is gone from the cluster, not
        Ready, cordoned or draining right now."""
        now = self._clock()
        for name in status.lost_nodes:
            self._lost.setdefault(name, now)
        nodes = {n.name: n for n in self.capacity(now)}
        bad = set(status.lost_nodes)
        for name in job.placement:
            node = nodes.get(name)
            if node is None or node.cordoned or node.state in ("cordoned", "draining"):
                bad.add(name)
        return frozenset(bad & set(job.placement))

    def sync(self, now: float) -> None:
        """Mirror the cordon states onto the executor's nodes (the Kubernetes Node:
        unschedulable + taint); the stored state is the intent, this repairs drift."""
        if self._node_sync is None:
            return
        try:
            self._node_sync(self.states(now))
        except (TensoryardError, OSError):  # the sync logs its own; never stop the loop
            log.exception("mirroring node cordon states failed; retrying next cycle")
