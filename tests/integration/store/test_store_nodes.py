"""Nodes, their cordon state and history on SQLite and PostgreSQL: each change and its history
line are one transaction, concurrent reporters of one fault write one line."""

from __future__ import annotations

import threading

import pytest

from tensoryard.errors import NotFound, SpecError
from tensoryard.store import Store


def test_registration_is_idempotent_and_keeps_the_state_of_known_nodes(store: Store) -> None:
    assert store.register_nodes(["n2", "n1", "n1"]) == ["n1", "n2"]
    store.set_node_state("n1", "draining", reason="XID 79 on GPU 2", actor="agent")
    assert store.register_nodes(["n1", "n2", "n3"]) == ["n3"]
    assert [(n.name, n.state, n.reason) for n in store.list_nodes()] == [
        ("n1", "draining", "XID 79 on GPU 2"),
        ("n2", "ready", ""),
        ("n3", "ready", ""),
    ]


def test_history_is_newest_first_and_uncordon_clears_the_reason(store: Store) -> None:
    store.register_nodes(["n1"])
    store.set_node_state("n1", "cordoned", reason="maintenance", actor="alice")
    store.set_node_state("n1", "draining", reason="IB port mlx5_0/1 down", actor="agent")
    node, changed = store.set_node_state("n1", "ready", reason="cable replaced", actor="alice")
    assert changed and (node.state, node.reason) == ("ready", "")
    history = store.node_history("n1")
    assert [(e.kind, e.actor, e.message) for e in history] == [
        ("uncordon", "alice", "cable replaced"),
        ("drain", "agent", "IB port mlx5_0/1 down"),
        ("cordon", "alice", "maintenance"),
        ("registered", "", ""),
    ]
    assert [e.kind for e in store.node_history("n1", limit=1)] == ["uncordon"]
    _, again = store.set_node_state("n1", "ready", reason="", actor="alice")
    assert not again


def test_concurrent_reports_of_one_fault_write_one_history_line(store: Store) -> None:
    if store.url == "sqlite://":
        pytest.skip("in-memory SQLite is single-threaded")
    store.register_nodes(["n1"])
    results: list[bool] = []

    def report() -> None:
        results.append(
            store.set_node_state("n1", "draining", reason="XID 79 on GPU 2", actor="agent")[1]
        )

    threads = [threading.Thread(target=report) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]
    assert [e.kind for e in store.node_history("n1")] == ["drain", "registered"]


def test_bad_names_and_unknown_nodes_are_refused_with_the_fix(store: Store) -> None:
    with pytest.raises(SpecError, match="node"):
        store.register_nodes([""])
    with pytest.raises(NotFound, match="tyard nodes list"):
        store.node_history("ghost")
    with pytest.raises(NotFound, match="tyard nodes list"):
        store.set_node_state("ghost", "cordoned", reason="x", actor="a")
    assert store.list_nodes() == []
