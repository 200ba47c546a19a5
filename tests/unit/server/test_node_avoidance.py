"""Which nodes a job's next placement avoids (scheduling.failed_on, nodes_to_avoid): where two
of its attempts failed because of something on the node, as long as the job still fits
elsewhere."""

from __future__ import annotations

from datetime import UTC, datetime

from tensoryard.server.scheduling import NodeCapacity, failed_on, nodes_to_avoid
from tensoryard.spec.job import parse_job_spec
from tensoryard.store import AttemptRecord

T = datetime(2026, 12, 4, tzinfo=UTC)


def attempt(number: int, state: str, nodes: tuple[str, ...], reason: str = "") -> AttemptRecord:
    return AttemptRecord(
        job_id=7,
        number=number,
        state=state,
        handle={},
        started_at=T,
        finished_at=T,
        exit_code=1,
        reason=reason,
        resumed_from_step=None,
        last_heartbeat=None,
        nodes=nodes,
    )


def nodes(*names: str, gpus: int = 8) -> tuple[NodeCapacity, ...]:
    return tuple(NodeCapacity(n, 32.0, 1 << 40, tuple(range(gpus)), "H100") for n in names)


def spec(node_count: int = 1):  # type: ignore[no-untyped-def]
    return parse_job_spec(
        {
            "name": "x",
            "command": ["train.py"],
            "image": "i",
            "resources": {"nodes": node_count, "gpus_per_node": 8},
        }
    )


def test_single_node_failures_count_against_their_node_and_others_do_not() -> None:
    history = [
        attempt(1, "failed", ("a",)),
        attempt(2, "cancelled", ("a",)),  # a cancel is nobody's fault
        attempt(3, "lost", ("a",)),
        attempt(4, "failed", ()),  # recorded before nodes were kept
        attempt(5, "failed", ("b",)),
    ]
    assert failed_on(history) == {"a": [1, 3], "b": [5]}
    avoid, why = nodes_to_avoid(history, nodes("a", "b"), spec())
    assert avoid == {"a"} and why == "next placement avoids a (a: attempts 1, 3 failed there)"


def test_a_gang_failure_counts_only_against_the_nodes_its_reason_names() -> None:
    history = [
        attempt(1, "failed", ("a", "b"), "rank 3 exited with code 1"),  # the job's own bug
        attempt(2, "failed", ("a", "b"), "rank 3 exited with code 1"),
        attempt(3, "lost", ("a", "c"), "node c lost: not ready for 60 s"),
        attempt(4, "failed", ("b", "c"), "node c: pod evicted"),
    ]
    assert failed_on(history) == {"c": [3, 4]}
    avoid, _ = nodes_to_avoid(history, nodes("a", "b", "c"), spec(2))
    assert avoid == {"c"}


def test_nothing_is_avoided_when_the_job_would_not_fit_elsewhere() -> None:
    history = [attempt(1, "failed", ("a",)), attempt(2, "failed", ("a",))]
    avoid, why = nodes_to_avoid(history, nodes("a"), spec())
    assert avoid == frozenset()
    assert why.startswith("not avoiding a (a: attempts 1, 2 failed there): only 0 other")
    small = nodes("b", gpus=4)  # the other node is too small for 8 GPUs
    assert nodes_to_avoid(history, (*nodes("a"), *small), spec())[0] == frozenset()
    assert nodes_to_avoid(history, (*nodes("a"), *nodes("b")), spec())[0] == {"a"}


def _cap(name: str, switch: str = "s1", gpus: int = 8, **kw: object) -> NodeCapacity:
    return NodeCapacity(name, 32.0, 1 << 40, tuple(range(gpus)), "H100", switch=switch, **kw)  # type: ignore[arg-type]


def test_a_gone_node_is_replaced_by_a_free_spare_under_the_kept_nodes_switch() -> None:
    from tensoryard.server.scheduling import replacement_placement

    placement = {"a": list(range(8)), "b": list(range(8))}
    nodes = (_cap("a"), _cap("b"), _cap("far", switch="s2"), _cap("near"), _cap("busy"))
    busy = ({"busy": [0, 1]}, spec())  # another job holds 2 GPUs of "busy"
    new = replacement_placement(placement, frozenset({"b"}), spec(2), nodes, [busy])
    assert new == {"a": list(range(8)), "near": list(range(8))}  # same switch as "a" first
    # without "near", the spare on the other switch; "busy" has only 6 GPUs free
    nodes2 = (_cap("a"), _cap("b"), _cap("far", switch="s2"), _cap("busy"))
    assert replacement_placement(placement, frozenset({"b"}), spec(2), nodes2, [busy]) == {
        "a": list(range(8)),
        "far": list(range(8)),
    }


def test_no_replacement_without_enough_healthy_free_spares() -> None:
    from tensoryard.server.scheduling import replacement_placement

    placement = {"a": list(range(8)), "b": list(range(8))}
    cordoned = _cap("c", cordoned=True)
    draining = _cap("d", state="draining")
    small = _cap("e", gpus=4)
    nodes = (_cap("a"), _cap("b"), cordoned, draining, small, _cap("f"))
    gone = frozenset({"b"})
    assert (
        replacement_placement(placement, gone, spec(2), nodes, [], avoid=frozenset({"f"})) is None
    )
    assert replacement_placement(placement, gone, spec(2), nodes, [])["f"] == list(range(8))  # type: ignore[index]
    # every node of the gang gone: nothing to keep, the job is requeued whole
    assert replacement_placement(placement, frozenset({"a", "b"}), spec(2), nodes, []) is None


def test_a_gang_failure_counts_against_its_root_causes_node_only() -> None:
    reason = "rank 1 exited with code 3 on node b; rank 0 exited with code 1 on node a"
    history = [attempt(1, "failed", ("a", "b"), reason), attempt(2, "failed", ("a", "b"), reason)]
    assert failed_on(history) == {"b": [1, 2]}
