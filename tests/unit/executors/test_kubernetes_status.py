"""Kubernetes objects -> attempt phases with reasons a user can act on (no cluster needed).

Pods and JobSets here are shaped like the API server's JSON (what `sanitize_for_serialization`
gives the executor); the e2e_k8s tests check the same mapping against the real controllers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tensoryard.executors.base import CONFIG_EXIT_CODE, AttemptPhase
from tensoryard.executors.kubernetes.status import (
    attempt_status,
    node_loss,
    parse_quantity,
)

IMAGE = "ghcr.io/example/trainer:1.0"


def pod(
    rank: int, phase: str = "Running", node: str | None = None, **status: Any
) -> dict[str, Any]:
    node = node if node is not None else f"gpu-{rank}"
    return {
        "metadata": {
            "name": f"ty-7-1-node-0-{rank}-abcde",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
        },
        "spec": {
            "nodeName": node or None,
            "containers": [
                {"name": "trainer", "image": IMAGE, "resources": {"limits": {"memory": "64Gi"}}}
            ],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
            **status,
        },
    }


def pinned(rank: int, nodes: list[str]) -> dict[str, Any]:
    """A pending pod the JobSet recreated, pinned by tensoryard's affinity to `nodes`."""
    p = pod(rank, "Pending", node="")
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
        }
    }
    return p


def terminated(code: int, reason: str) -> dict[str, Any]:
    return {
        "containerStatuses": [
            {
                "name": "trainer",
                "image": IMAGE,
                "state": {"terminated": {"exitCode": code, "reason": reason}},
            }
        ]
    }


def jobset(*conditions: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "ty-7-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T17:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "conditions": [{"type": c, "status": "True", "message": f"{c} msg"} for c in conditions]
        },
    }


CASES = [
    pytest.param(
        jobset(), [pod(0), pod(1)], {}, AttemptPhase.RUNNING, "", id="all pods running is RUNNING"
    ),
    pytest.param(
        jobset(), [pod(0)], {}, AttemptPhase.STARTING, "", id="one of two pods running is STARTING"
    ),
    pytest.param(
        jobset("Completed"),
        [pod(0, "Succeeded"), pod(1, "Succeeded")],
        {},
        AttemptPhase.SUCCEEDED,
        "every pod of JobSet ty-7-1 succeeded",
        id="a completed JobSet is SUCCEEDED",
    ),
    pytest.param(
        jobset(),
        [pod(0, "Succeeded"), pod(1, "Succeeded")],
        {},
        AttemptPhase.SUCCEEDED,
        "every pod of JobSet ty-7-1 succeeded",
        id="every rank's pod succeeded: SUCCEEDED before the controllers mark the JobSet",
    ),
    pytest.param(
        jobset(),
        [pod(0, "Succeeded")],
        {},
        AttemptPhase.STARTING,
        "",
        id="one of two ranks succeeded and the other has no pod yet: not over",
    ),
    pytest.param(
        jobset(),
        [pod(0, "Succeeded"), pod(1, "Succeeded"), pod(1, "Pending", node="")],
        {},
        AttemptPhase.STARTING,
        "",
        id="a rank's pod recreated and waiting: not over",
    ),
    pytest.param(
        jobset(),
        [pod(0, "Succeeded"), pod(1, "Succeeded")],
        {"cancelled": True},
        AttemptPhase.STARTING,
        "",
        id="a cancelled attempt is over when its objects are gone, not when its pods ended",
    ),
    pytest.param(
        jobset(),
        [pod(0), pod(1, "Failed", **terminated(137, "OOMKilled"))],
        {},
        AttemptPhase.FAILED,
        "rank 1 (pod ty-7-1-node-0-1-abcde on node gpu-1) was OOMKilled (memory limit 64Gi; "
        "exit code 137)",
        id="an OOMKilled pod names the memory limit",
    ),
    pytest.param(
        jobset(),
        [pod(0, "Failed", **terminated(3, "Error")), pod(1)],
        {},
        AttemptPhase.FAILED,
        "rank 0 (pod ty-7-1-node-0-0-abcde on node gpu-0) exited with code 3 (Error)",
        id="a pod that exited non-zero fails the attempt at once",
    ),
    pytest.param(
        jobset(),
        [
            pod(0),
            pod(1, "Failed", reason="Evicted", message="The node was low on resource: memory."),
        ],
        {},
        AttemptPhase.FAILED,
        "rank 1 (pod ty-7-1-node-0-1-abcde on node gpu-1) was evicted: The node was low on "
        "resource: memory.",
        id="an evicted pod says so with the kubelet's message",
    ),
    pytest.param(
        jobset(),
        [pod(0), pod(1)],
        {"lost_nodes": {"gpu-1": "node gpu-1 NotReady since 12:01:03Z (NodeStatusUnknown)"}},
        AttemptPhase.FAILED,
        "node gpu-1 NotReady since 12:01:03Z (NodeStatusUnknown) under rank 1 "
        "(pod ty-7-1-node-0-1-abcde on node gpu-1)",
        id="a node that went NotReady fails the gang, naming the node and since when",
    ),
    pytest.param(
        jobset(),
        [pod(0), pinned(1, ["gpu-0", "gpu-1"])],
        {"lost_nodes": {"gpu-1": "node gpu-1 deleted"}},
        AttemptPhase.FAILED,
        "node gpu-1 deleted under rank 1 (pod ty-7-1-node-0-1-abcde)",
        id="a pod recreated for a deleted node it is pinned to fails the attempt at once",
    ),
    pytest.param(
        jobset(),
        [pod(0), pod(1)],
        {"lost_nodes": {"gpu-9": "node gpu-9 deleted"}},
        AttemptPhase.RUNNING,
        "",
        id="a lost node the attempt does not use changes nothing",
    ),
    pytest.param(
        jobset(),
        [
            pod(0),
            pod(
                1,
                "Failed",
                conditions=[
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByTaintManager",
                        "message": "Taint manager: deleting due to NoExecute taint",
                    }
                ],
            ),
        ],
        {},
        AttemptPhase.FAILED,
        "rank 1 (pod ty-7-1-node-0-1-abcde on node gpu-1) is being disrupted "
        "(DeletionByTaintManager: Taint manager: deleting due to NoExecute taint)",
        id="a pod's DisruptionTarget condition is its failure's reason",
    ),
    pytest.param(
        jobset(),
        [
            pod(
                0,
                "Pending",
                node="",
                containerStatuses=[
                    {
                        "name": "trainer",
                        "image": "Bad Image ",
                        "state": {
                            "waiting": {
                                "reason": "InvalidImageName",
                                "message": 'cannot parse image name "Bad Image "',
                            }
                        },
                    }
                ],
            ),
            pod(1, "Pending", node=""),
        ],
        {},
        AttemptPhase.FAILED,
        "rank 0 (pod ty-7-1-node-0-0-abcde) cannot start (InvalidImageName: cannot parse "
        'image name "Bad Image ")',
        id="an invalid image name fails the attempt at once instead of a 15-minute wait",
    ),
    pytest.param(
        jobset(),
        [
            pod(
                0,
                "Pending",
                containerStatuses=[
                    {
                        "name": "trainer",
                        "image": IMAGE,
                        "state": {
                            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}
                        },
                    }
                ],
            ),
        ],
        {},
        AttemptPhase.STARTING,
        f"image {IMAGE} cannot be pulled (ImagePullBackOff: Back-off pulling)",
        id="an image that cannot be pulled is named",
    ),
    pytest.param(
        jobset(),
        [
            pod(
                0,
                "Pending",
                node="",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                    }
                ],
            ),
        ],
        {},
        AttemptPhase.STARTING,
        "FailedScheduling: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        id="an unschedulable pod carries the scheduler's message",
    ),
    pytest.param(
        None,
        [],
        {},
        AttemptPhase.LOST,
        "the JobSet of this attempt was deleted outside tensoryard (or it ended and its "
        "ttlSecondsAfterFinished ran out while the control plane was down: raise "
        "`tyard server --keep-finished`)",
        id="a JobSet deleted by someone else is LOST",
    ),
    pytest.param(
        None,
        [],
        {"cancelled": True},
        AttemptPhase.CANCELLED,
        "cancelled: every object deleted",
        id="a cancelled attempt is CANCELLED once every object is gone",
    ),
    pytest.param(
        jobset(deleting=True),
        [pod(0, "Failed", **terminated(143, "Error"))],
        {"cancelled": True},
        AttemptPhase.STARTING,
        "",
        id="a cancelled attempt whose pods still stop is not yet over, whatever they exit with",
    ),
]


@pytest.mark.parametrize(("owner", "pods", "extra", "phase", "reason"), CASES)
def test_attempt_status(
    owner: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    extra: dict[str, Any],
    phase: AttemptPhase,
    reason: str,
) -> None:
    status = attempt_status("JobSet", owner, pods, nodes=2, **extra)
    assert (status.phase, status.reason) == (phase, reason)


def test_an_indexed_job_is_judged_by_its_own_conditions() -> None:
    job = {
        "metadata": {"name": "ty-7-1"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    assert attempt_status("Job", job, [], nodes=2).phase is AttemptPhase.SUCCEEDED
    failed = {
        "metadata": {"name": "ty-7-1"},
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]
        },
    }
    status = attempt_status("Job", failed, [], nodes=2)
    assert (status.phase, status.reason) == (AttemptPhase.FAILED, "BackoffLimitExceeded")


def test_the_failed_ranks_and_exit_code_are_reported() -> None:
    pods = [pod(0, "Failed", **terminated(2, "Error")), pod(1, "Failed", **terminated(2, "Error"))]
    status = attempt_status("JobSet", jobset(), pods, nodes=2)
    assert status.exit_code == 2
    assert status.failed_ranks == (0, 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Decimal(8)),
        ("500m", Decimal("0.5")),
        ("2000Gi", Decimal(2000 * 2**30)),
        ("1k", Decimal(1000)),
        ("", Decimal(0)),
        ("junk", Decimal(0)),
    ],
)
def test_quantities_parse_like_kubernetes(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (None, "node n2 deleted"),
        (
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "Unknown",
                            "reason": "NodeStatusUnknown",
                            "message": "Kubelet stopped posting node status.",
                            "lastTransitionTime": "2026-12-06T12:01:03Z",
                        }
                    ]
                }
            },
            "node n2 Unknown since 2026-12-06T12:01:03Z (NodeStatusUnknown: Kubelet stopped "
            "posting node status.)",
        ),
        (
            {
                "spec": {
                    "taints": [
                        {
                            "key": "node.kubernetes.io/unreachable",
                            "effect": "NoExecute",
                            "timeAdded": "2026-12-06T12:01:08Z",
                        }
                    ]
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            "node n2 tainted node.kubernetes.io/unreachable:NoExecute since 2026-12-06T12:01:08Z",
        ),
        (
            {
                "spec": {"unschedulable": True},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            None,
        ),
    ],
    ids=["deleted", "kubelet stopped posting status", "unreachable taint", "cordoned is no loss"],
)
def test_a_lost_node_is_said_in_words(node: dict[str, Any] | None, said: str | None) -> None:
    assert node_loss("n2", node) == said


def test_the_lost_nodes_of_a_failed_attempt_are_named_for_the_next_placement() -> None:
    status = attempt_status(
        "JobSet", jobset(), [pod(0), pod(1)], nodes=2, lost_nodes={"gpu-1": "node gpu-1 deleted"}
    )
    assert status.lost_nodes == ("gpu-1",) and status.failed_ranks == (1,)


def test_a_configuration_error_carries_the_pods_termination_message_and_its_code() -> None:
    failed = terminated(78, "Error")
    said = "image localhost/tensoryard/cpu:0.1.0 does not match the matrix entry 'cpu':\n torch"
    failed["containerStatuses"][0]["state"]["terminated"]["message"] = said
    status = attempt_status("JobSet", jobset(), [pod(0, "Failed", **failed), pod(1)], nodes=2)
    assert status.phase is AttemptPhase.FAILED and status.exit_code == CONFIG_EXIT_CODE
    assert status.reason == (
        "rank 0 (pod ty-7-1-node-0-0-abcde on node gpu-0) exited with code 78 (configuration "
        "error): image localhost/tensoryard/cpu:0.1.0 does not match the matrix entry 'cpu': torch"
    )
    # Another code keeps its short reason (a log's end is not the reason of an ordinary crash).
    crashed = terminated(1, "Error")
    crashed["containerStatuses"][0]["state"]["terminated"]["message"] = "Traceback ..."
    status = attempt_status("JobSet", jobset(), [pod(0, "Failed", **crashed), pod(1)], nodes=2)
    assert status.reason.endswith("exited with code 1 (Error)")
