"""Gang placement, topology, best fit, node health, CPU-only work."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_builders import make_nodes, make_quotas, make_workload, schedule

from tensoryard.scheduler import Node, SchedulerConfig
from tensoryard.spec.queue import QueueSpec, QuotaConfig

BIG = make_quotas({"team-a": {"H100": 1024}})


def test_a_gang_is_placed_all_or_nothing() -> None:
    gang = make_workload("gang").gpus(8).nodes(3).obj()
    decisions = schedule(make_nodes(2), BIG, [gang])
    assert decisions.admissions == ()
    assert decisions.pending["gang"].code == "unschedulable"


def test_a_gang_gets_distinct_nodes_with_the_gpus_it_asked_for() -> None:
    gang = make_workload("gang").gpus(4).nodes(3).obj()
    decisions = schedule(make_nodes(4), BIG, [gang])
    placement = decisions.admitted["gang"]
    assert len(placement.gpus) == 3
    assert all(len(ix) == 4 for ix in placement.gpus.values())


def test_small_jobs_best_fit_so_whole_nodes_stay_free() -> None:
    running = [make_workload("r").gpus(6).running_on({"n0": range(6)}, start=0).obj()]
    small = make_workload("small").gpus(2).obj()
    decisions = schedule(make_nodes(2), BIG, [small], running)
    assert decisions.admitted["small"].gpus == {"n0": (6, 7)}


@pytest.mark.parametrize(
    ("topology", "busy_nodes", "expected_switches"),
    [
        ("required", [], 1),
        ("preferred", [], 1),
        ("preferred", ["n0", "n4"], 2),
        ("required", ["n0", "n4"], None),
    ],
    ids=[
        "a gang that fits under one switch is kept under one (required)",
        "a gang that fits under one switch is kept under one (preferred)",
        "a preferred gang spreads when no switch has room",
        "a required gang waits rather than spread",
    ],
)
def test_multi_node_gangs_use_as_few_leaf_switches_as_possible(
    topology: str, busy_nodes: list[str], expected_switches: int | None
) -> None:
    nodes = make_nodes(8, per_switch=4)
    running = [
        make_workload(f"busy-{n}")
        .gpus(8)
        .running_on({n: range(8)}, start=0)
        .not_preemptible()
        .obj()
        for n in busy_nodes
    ]
    gang = make_workload("gang").gpus(8).nodes(4).topology(topology).obj()
    decisions = schedule(nodes, BIG, [gang], running)
    if expected_switches is None:
        assert decisions.admissions == ()
        return
    switch_of = {n.name: n.switch for n in nodes}
    used = {switch_of[name] for name in decisions.admitted["gang"].gpus}
    assert len(used) == expected_switches


def test_a_gang_picks_the_tightest_switch_that_holds_it() -> None:
    nodes = make_nodes(8, per_switch=4)
    running = [make_workload("r").gpus(8).running_on({"n0": range(8)}, start=0).obj()]
    gang = make_workload("gang").gpus(8).nodes(3).obj()
    decisions = schedule(nodes, BIG, [gang], running)
    assert set(decisions.admitted["gang"].gpus) == {"n1", "n2", "n3"}


def test_a_gang_that_must_spread_stays_inside_one_spine_block() -> None:
    # four switches of two nodes; switches 0-1 in block a, 2-3 in block b; one node busy in
    # switches 0 and 2, so a 3-node gang must spread over two switches.
    nodes = tuple(
        Node(f"n{i}", "H100", 8, 64.0, switch=f"sw{i // 2}", block="a" if i < 4 else "b")
        for i in range(8)
    )
    running = [
        make_workload(f"busy-{n}").gpus(8).running_on({n: range(8)}, start=0).obj()
        for n in ("n0", "n4")
    ]
    gang = make_workload("gang").gpus(8).nodes(3).obj()
    decisions = schedule(nodes, BIG, [gang], running, config=SchedulerConfig(reclaim=False))
    blocks = {n.name: n.block for n in nodes}
    assert len({blocks[name] for name in decisions.admitted["gang"].gpus}) == 1


@pytest.mark.parametrize(
    "change",
    [{"cordoned": True}, {"draining": True}],
    ids=["a cordoned node takes no new work", "a draining node takes no new work"],
)
def test_unhealthy_nodes_take_no_new_work(change: dict) -> None:
    nodes = tuple(replace(n, **change) if n.name == "n0" else n for n in make_nodes(2))
    jobs = [make_workload(f"j{i}").gpus(8).submitted(i).obj() for i in range(2)]
    decisions = schedule(nodes, BIG, jobs)
    assert [a.workload_id for a in decisions.admissions] == ["j0"]
    assert set(decisions.admitted["j0"].gpus) == {"n1"}


def test_unavailable_gpus_are_never_handed_out() -> None:
    nodes = (Node("n0", "H100", 8, 64.0, unavailable_gpus=(0, 1, 2)),)
    jobs = [make_workload(f"j{i}").gpus(1).submitted(i).obj() for i in range(8)]
    decisions = schedule(nodes, BIG, jobs)
    handed = [g for a in decisions.admissions for ix in a.placement.gpus.values() for g in ix]
    assert sorted(handed) == [3, 4, 5, 6, 7]


def test_cpu_and_memory_limit_what_fits_on_a_node() -> None:
    nodes = make_nodes(1, cpu=8, mem=100)
    jobs = [make_workload(f"j{i}").gpus(1).cpu(3).memory(40).submitted(i).obj() for i in range(4)]
    decisions = schedule(nodes, BIG, jobs)
    assert len(decisions.admissions) == 2


def test_cpu_only_workloads_run_on_a_cpu_only_machine() -> None:
    quotas = QuotaConfig.build([QueueSpec(name="default")])
    local = make_nodes(1, gpus=0, cpu=4, prefix="local")
    jobs = [make_workload(f"j{i}", "default").cpu_only(1.5).submitted(i).obj() for i in range(3)]
    decisions = schedule(local, quotas, jobs)
    assert [a.workload_id for a in decisions.admissions] == ["j0", "j1"]
    assert decisions.admitted["j0"].gpu_model is None
    assert decisions.admitted["j0"].gpus == {"local0": ()}
    info = decisions.pending["j2"]
    assert info.code == "reserved"  # head of line: the machine is held for it
    assert info.eta_s is None  # nothing running there has a runtime estimate


def test_cpu_only_workloads_prefer_cpu_nodes_and_may_use_gpu_nodes() -> None:
    nodes = make_nodes(1, gpus=0, cpu=2, prefix="cpu") + make_nodes(1, cpu=8)
    quotas = make_quotas({"team-a": {"H100": 8}})
    jobs = [make_workload(f"j{i}").cpu_only(2).submitted(i).obj() for i in range(2)]
    decisions = schedule(nodes, quotas, jobs)
    assert set(decisions.admitted["j0"].gpus) == {"cpu0"}
    assert set(decisions.admitted["j1"].gpus) == {"n0"}
    strict = schedule(nodes, quotas, jobs, config=SchedulerConfig(cpu_on_gpu_nodes=False))
    assert [a.workload_id for a in strict.admissions] == ["j0"]


def test_a_workload_asking_for_a_model_runs_only_on_that_model() -> None:
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="H100", prefix="h")
    quotas = make_quotas({"team-a": {"H100": 8, "A100": 8}})
    job = make_workload("j").gpus(8).model("H100").obj()
    decisions = schedule(nodes, quotas, [job])
    assert decisions.admitted["j"].gpu_model == "H100"
    assert set(decisions.admitted["j"].gpus) == {"h0"}


def test_a_workload_without_a_model_falls_back_to_another_model_with_quota() -> None:
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="H100", prefix="h")
    quotas = make_quotas({"team-a": {"H100": 8, "A100": 8}})
    jobs = [make_workload(f"j{i}").gpus(8).submitted(i).obj() for i in range(2)]
    decisions = schedule(nodes, quotas, jobs)
    assert {a.placement.gpu_model for a in decisions.admissions} == {"A100", "H100"}


@pytest.mark.parametrize(
    ("builder", "fragment"),
    [
        (make_workload("w").gpus(16), "largest node has 8"),
        (make_workload("w").gpus(8).model("B200"), "no schedulable node has GPU model B200"),
        (make_workload("w", "ghost").gpus(1), "queue ghost does not exist"),
        (make_workload("w").gpus(8).nodes(4), "can never hold more than 16"),
    ],
    ids=[
        "more GPUs per node than any node has",
        "a GPU model the cluster lacks",
        "a queue that does not exist",
        "more GPUs than the queue could ever hold",
    ],
)
def test_impossible_requests_say_why_and_how_to_fix(builder, fragment: str) -> None:
    quotas = make_quotas({"team-a": {"H100": 8}, "team-b": {"H100": 8}})
    decisions = schedule(make_nodes(4), quotas, [builder.obj()])
    info = decisions.pending["w"]
    assert info.code == "unschedulable"
    assert fragment in info.reason
    assert info.eta_s is None


@pytest.mark.parametrize(
    ("nodes", "builder", "reason"),
    [
        (
            make_nodes(1),
            make_workload("w").gpus(8).nodes(2),
            "cannot fit the cluster as it is: needs 2 nodes of 8 H100 GPUs; the cluster has 1 "
            "node(s) with 8 or more H100 GPUs (short by 1); it starts when nodes are added (fix: "
            "ask for at most 1 nodes)",
        ),
        (
            make_nodes(2) + make_nodes(3, gpus=4, prefix="s"),
            make_workload("w").gpus(8).nodes(3),
            "cannot fit the cluster as it is: needs 3 nodes of 8 H100 GPUs; the cluster has 2 "
            "node(s) with 8 or more H100 GPUs (short by 1); it starts when nodes are added (fix: "
            "ask for at most 2 nodes)",
        ),
        (
            make_nodes(1, model="A100", gpus=4, prefix="a") + make_nodes(1),
            make_workload("w").gpus(8).model("A100").nodes(2),
            "cannot fit the cluster as it is: needs 2 nodes of 8 A100 GPUs; the cluster has 0 "
            "node(s) with 8 or more A100 GPUs (short by 2); it starts when nodes are added (fix: "
            "ask for fewer GPUs per node)",
        ),
        (
            make_nodes(2, gpus=0),
            make_workload("w").cpu_only().nodes(3),
            "cannot fit the cluster as it is: needs 3 nodes; the cluster has 2 (short by 1); it "
            "starts when nodes are added (fix: ask for at most 2 nodes)",
        ),
    ],
    ids=[
        "a 2-node gang on a 1-node cluster",
        "more nodes with enough GPUs than there are, smaller nodes not counted",
        "a model whose nodes are all too small",
        "a CPU gang larger than the cluster",
    ],
)
def test_a_gang_the_cluster_as_it_is_cannot_hold_says_what_is_short(
    nodes: tuple[Node, ...], builder, reason: str
) -> None:
    quotas = make_quotas({"team-a": {"H100": 64, "A100": 64}})
    info = schedule(nodes, quotas, [builder.obj()]).pending["w"]
    assert (info.code, info.reason, info.eta_s) == ("unschedulable", reason, None)


def test_a_gang_waits_for_nodes_to_be_added_and_starts_when_they_are() -> None:
    gang = make_workload("gang").gpus(8).nodes(2).obj()
    assert (
        "cannot fit the cluster as it is"
        in schedule(make_nodes(1), BIG, [gang]).pending["gang"].reason
    )
    grown = schedule(make_nodes(2), BIG, [gang])  # the autoscaler added a node
    assert set(grown.admitted["gang"].gpus) == {"n0", "n1"}


def test_avoided_nodes_are_never_chosen_even_when_they_fit_best() -> None:
    running = [make_workload("r").gpus(6).running_on({"n0": range(6)}, start=0).obj()]
    small = replace(make_workload("small").gpus(2).obj(), avoid_nodes=frozenset({"n0"}))
    decisions = schedule(make_nodes(2), BIG, [small], running)
    assert set(decisions.admitted["small"].gpus) == {"n1"}  # n0 fits best, but is avoided


def test_a_gang_avoiding_nodes_is_placed_on_the_others_or_waits() -> None:
    gang = replace(make_workload("gang").gpus(8).nodes(2).obj(), avoid_nodes=frozenset({"n1"}))
    decisions = schedule(make_nodes(3), BIG, [gang])
    assert set(decisions.admitted["gang"].gpus) == {"n0", "n2"}
    blocked = replace(gang, avoid_nodes=frozenset({"n0", "n1"}))
    decisions = schedule(make_nodes(3), BIG, [blocked])
    assert decisions.admissions == ()
