"""Nodes and their cordon state: the store's half of the closed health loop.

A mixin of :class:`tensoryard.store.Store` (same transactions, clock and error translation).
Each change of a node's state and the history line that says why are one transaction; a change
that changes nothing (a second report of the same fault) writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from tensoryard.errors import FieldIssue, NotFound, SpecError
from tensoryard.store._rows import RowReader
from tensoryard.store.models import NODE_NAME_LEN, NODE_STATES, Node, NodeEvent
from tensoryard.store.records import NodeEventRecord, NodeRecord

__all__ = ["NODE_STATES", "NodesMixin"]

_MAX_HISTORY = 10_000


class NodesMixin:
    """Node registration, cordon/drain/uncordon and per-node history. Needs ``_tx``, ``_now``."""

    if TYPE_CHECKING:

        def _tx(self, action: str, *, write: bool) -> AbstractContextManager[Session]: ...

        def _now(self) -> datetime: ...

    def register_nodes(self, names: Iterable[str]) -> list[str]:
        """Add the nodes not known yet (state ready, a `registered` history line); returns the
        names added. Known nodes keep their state: a restart never uncordons anything."""
        wanted = sorted(set(names))
        for name in wanted:
            _check_name(name)
        with self._tx("register nodes", write=True) as s:
            known = set(s.scalars(select(Node.name).where(Node.name.in_(wanted))))
            added = [n for n in wanted if n not in known]
            now = self._now()
            for name in added:
                s.add(Node(name=name, state="ready", reason="", created_at=now, changed_at=now))
            s.flush()
            for name in added:
                s.add(NodeEvent(node=name, ts=now, kind="registered", actor="", message=""))
            return added

    def list_nodes(self) -> list[NodeRecord]:
        with self._tx("list nodes", write=False) as s:
            return [_record(n) for n in s.scalars(select(Node).order_by(Node.name))]

    def get_node(self, name: str) -> NodeRecord:
        with self._tx(f"read node {name}", write=False) as s:
            return _record(_node(s, name))

    def set_node_state(
        self, name: str, state: str, *, reason: str, actor: str
    ) -> tuple[NodeRecord, bool]:
        """Move a node to `state` (ready | cordoned | draining) for `reason`; returns the node
        and whether anything changed. Cordoning a draining node keeps it draining (a drain is
        only ended by an explicit uncordon)."""
        if state not in NODE_STATES:
            raise SpecError(
                [FieldIssue("state", f"{state!r} is not a node state", f"use {NODE_STATES}")]
            )
        with self._tx(f"set node {name} {state}", write=True) as s:
            node = _node(s, name, lock=True)
            if state == "cordoned" and node.state == "draining":
                state = "draining"
            if node.state == state and (state == "ready" or node.reason == reason):
                return _record(node), False
            kind = {"ready": "uncordon", "cordoned": "cordon", "draining": "drain"}[state]
            now = self._now()
            node.state, node.reason, node.changed_at = (
                state,
                "" if state == "ready" else reason,
                now,
            )
            s.add(NodeEvent(node=name, ts=now, kind=kind, actor=actor, message=reason))
            s.flush()
            return _record(node), True

    def node_heartbeat(self, name: str) -> NodeRecord:
        """The node's agent reported now (NotFound for a node the control plane does not
        place on). Not history: a heartbeat every few seconds would drown it; an agent that
        comes back after being silent is recorded by the control loop, which saw it go."""
        with self._tx(f"record the heartbeat of node {name}", write=True) as s:
            node = _node(s, name, lock=True)
            node.heartbeat_at = self._now()
            s.flush()
            return _record(node)

    def add_node_event(self, name: str, kind: str, *, actor: str, message: str) -> None:
        """Append a line to a node's history without changing its state (a preflight pass)."""
        with self._tx(f"record {kind} on node {name}", write=True) as s:
            _node(s, name)
            s.add(NodeEvent(node=name, ts=self._now(), kind=kind, actor=actor, message=message))

    def node_history(self, name: str, *, limit: int = 100) -> list[NodeEventRecord]:
        """A node's history, newest first (NotFound for an unknown node)."""
        limit = max(1, min(limit, _MAX_HISTORY))
        with self._tx(f"read the history of node {name}", write=False) as s:
            _node(s, name)
            query = (
                select(NodeEvent)
                .where(NodeEvent.node == name)
                .order_by(NodeEvent.id.desc())
                .limit(limit)
            )
            return [_event_record(e) for e in s.scalars(query)]


def _check_name(name: str) -> None:
    if not name or len(name) > NODE_NAME_LEN:
        raise SpecError(
            [FieldIssue("node", f"{name!r} is not a node name", "use 1-253 characters")]
        )


def _node(s: Session, name: str, *, lock: bool = False) -> Node:
    query = select(Node).where(Node.name == name)
    if lock:
        query = query.with_for_update()
    node = s.scalars(query).first()
    if node is None:
        raise NotFound(f"node {name!r} is not known (fix: `tyard nodes list` shows the nodes)")
    return node


_record = RowReader(NodeRecord, Node)
_event_record = RowReader(NodeEventRecord, NodeEvent)
