"""node_patch: the cordon state of tensoryard's nodes table as JSON patches of Node objects.

Each patch is applied here with `jsonpatch` semantics written out below (add/remove/test on
plain dicts), so the cases check the Node that results, not the list of operations.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tensoryard.executors.kubernetes.nodes import (
    ANNOTATION_OWNER,
    ANNOTATION_REASON,
    TAINT_KEY,
    NodeIntent,
    node_patch,
    taint_value,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def make_node(
    *, unschedulable: bool = False, taints: list[dict[str, str]] | None = None, **annotations: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": [GPU_TAINT] if taints is None else taints}
    if unschedulable:
        spec["unschedulable"] = True
    meta: dict[str, Any] = {"name": "n1", "resourceVersion": "7"}
    if annotations:
        meta["annotations"] = {k.replace("__", "/"): v for k, v in annotations.items()}
    return {"metadata": meta, "spec": spec}


def _unpointer(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def apply(node: dict[str, Any], ops: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A minimal RFC 6902 applier for the operations node_patch emits."""
    out = copy.deepcopy(node)
    for op in ops or []:
        *parents, last = [_unpointer(p) for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target[p]
        if op["op"] == "test":
            assert target[last] == op["value"], f"test failed at {op['path']}"
        elif op["op"] == "add":
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            raise AssertionError(f"unexpected op {op}")
    return out


CORDON = NodeIntent("n1", "draining", "XID 79 on GPU 2")
READY = NodeIntent("n1", "ready")
OUR_TAINT = {"key": TAINT_KEY, "value": "XID-79-on-GPU-2", "effect": "NoSchedule"}


def test_a_drain_cordons_a_schedulable_node_and_records_that_tensoryard_did_it() -> None:
    node = make_node()
    ops = node_patch(node, CORDON)
    assert ops is not None and ops[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "7",
    }
    after = apply(node, ops)
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == [GPU_TAINT, OUR_TAINT]
    assert after["metadata"]["annotations"] == {
        ANNOTATION_REASON: "XID 79 on GPU 2",
        ANNOTATION_OWNER: "tensoryard",
    }
    assert node_patch(after, CORDON) is None  # idempotent: nothing more to do


def test_uncordon_gives_back_exactly_what_tensoryard_took() -> None:
    node = make_node(**{"kept__by-admin": "yes"})
    cordoned = apply(node, node_patch(node, CORDON))
    back = apply(cordoned, node_patch(cordoned, READY))
    assert back["spec"].pop("unschedulable") is False  # the API server stores false as absent
    assert back == node
    assert node_patch(back, READY) is None


def test_a_node_an_admin_cordoned_by_hand_stays_cordoned_after_uncordon() -> None:
    node = make_node(unschedulable=True)
    cordoned = apply(node, node_patch(node, CORDON))
    assert cordoned["metadata"]["annotations"][ANNOTATION_OWNER] == "other"
    back = apply(cordoned, node_patch(cordoned, READY))
    assert back["spec"]["unschedulable"] is True
    assert back["spec"]["taints"] == [GPU_TAINT]
    assert "annotations" not in back or not back["metadata"].get("annotations")


def test_a_node_uncordoned_by_hand_while_tensoryard_holds_it_is_cordoned_again() -> None:
    node = make_node(unschedulable=True)
    cordoned = apply(node, node_patch(node, CORDON))
    cordoned["spec"]["unschedulable"] = False  # kubectl uncordon by someone
    repaired = apply(cordoned, node_patch(cordoned, CORDON))
    assert repaired["spec"]["unschedulable"] is True
    assert repaired["metadata"]["annotations"][ANNOTATION_OWNER] == "tensoryard"
    back = apply(repaired, node_patch(repaired, READY))
    assert back["spec"].get("unschedulable") is False


def test_a_new_reason_updates_the_taint_value_and_the_annotation() -> None:
    cordoned = apply(make_node(), node_patch(make_node(), CORDON))
    again = NodeIntent("n1", "draining", "ib port mlx5_0/1 down")
    after = apply(cordoned, node_patch(cordoned, again))
    assert after["spec"]["taints"][-1]["value"] == "ib-port-mlx5_0-1-down"
    assert after["metadata"]["annotations"][ANNOTATION_REASON] == "ib port mlx5_0/1 down"


def test_a_node_tensoryard_never_touched_is_left_alone_when_ready() -> None:
    assert node_patch(make_node(unschedulable=True), READY) is None
    assert node_patch(make_node(taints=[]), READY) is None


def test_a_leftover_taint_without_annotations_is_removed_on_uncordon() -> None:
    node = make_node(taints=[GPU_TAINT, OUR_TAINT])
    back = apply(node, node_patch(node, READY))
    assert back["spec"]["taints"] == [GPU_TAINT]
    assert "unschedulable" not in back["spec"]


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("XID 79 on GPU 2", "XID-79-on-GPU-2"),
        ("  maintenance!  ", "maintenance"),
        ("", "cordoned"),
        ("///", "cordoned"),
        ("x" * 100, "x" * 63),
        ("preflight failed: ecc: 3 uncorrected errors " + "y" * 40, None),
    ],
    ids=[
        "spaces become dashes",
        "punctuation at the ends is dropped",
        "an empty reason becomes cordoned",
        "nothing usable becomes cordoned",
        "long reasons are cut at 63",
        "a cut never ends on a dash",
    ],
)
def test_taint_values_follow_the_label_value_rules(reason: str, value: str | None) -> None:
    got = taint_value(reason)
    if value is not None:
        assert got == value
    assert len(got) <= 63
    assert got[0].isalnum() and got[-1].isalnum()
    assert all(c.isalnum() or c in "-_." for c in got)
