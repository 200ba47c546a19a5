"""Properties that must hold for every snapshot (hypothesis)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_builders import apply, gpus_in_use, make_workload

from tensoryard.scheduler import (
    Decisions,
    Node,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
QUEUES = ("a", "b", "c", "d")


@dataclass
class World:
    nodes: tuple[Node, ...]
    quotas: QuotaConfig
    pending: list[Workload]
    running: list[Workload]
    now: float
    config: SchedulerConfig


@st.composite
def worlds(draw: st.DrawFn) -> World:
    switches = draw(st.integers(1, 3))
    per_switch = draw(st.integers(1, 4))
    models = draw(st.sampled_from([("H100",), ("H100", "A100")]))
    nodes = tuple(
        Node(
            f"n{i}",
            models[i % len(models)],
            8,
            32.0,
            switch=f"s{i // per_switch}",
            unavailable_gpus=(7,) if draw(st.integers(0, 9)) == 0 else (),
            cordoned=draw(st.integers(0, 14)) == 0,
        )
        for i in range(switches * per_switch)
    )
    queues = []
    for i, name in enumerate(QUEUES[: draw(st.integers(2, 4))]):
        nominal = {m: draw(st.integers(0, 24)) for m in models}
        borrow = draw(st.one_of(st.none(), st.integers(0, 16)))
        queues.append(
            QueueSpec(
                name=name,
                cohort="left" if i % 2 else "right",
                nominal=nominal,
                borrowing_limit=borrow,
                weight=draw(st.sampled_from([1.0, 2.0])),
            )
        )
    cohorts = [CohortSpec(name="root"), CohortSpec(name="left", parent="root")]
    cohorts.append(CohortSpec(name="right", parent="root"))
    quotas = QuotaConfig.build(queues, cohorts)
    config = SchedulerConfig(
        max_reservations=draw(st.integers(0, 2)),
        service_preemption_min_run_s=draw(st.sampled_from([0.0, 600.0])),
        max_preemptors_per_cycle=draw(st.integers(0, 4)),
    )
    names = [q.name for q in queues]
    seed = draw(st.integers(0, 2**16))
    rng = random.Random(seed)

    def job(i: int, t: float) -> Workload:
        gpus = rng.choice([1, 1, 2, 4, 8])
        b = make_workload(f"w{i}", rng.choice(names)).gpus(gpus).submitted(t)
        b = b.nodes(rng.choice([1, 1, 1, 2, 3]) if gpus == 8 else 1)
        b = b.priority(rng.choice([0, 0, 1, 5])).topology(
            rng.choice(["none", "preferred", "required"])
        )
        if rng.random() < 0.5:
            b = b.estimate(rng.choice([300.0, 3600.0]))
        if rng.random() < 0.2:
            b = b.model(rng.choice(models))
        if rng.random() < 0.1:
            b = b.not_preemptible()
        if rng.random() < 0.2:
            b = b.attained(rng.choice([100.0, 5000.0]))
        return b.obj()

    first = [job(i, float(i)) for i in range(draw(st.integers(0, 30)))]
    # Reach a consistent running state by letting the scheduler itself place a first batch.
    decisions = Scheduler(config).schedule(Snapshot(nodes, quotas, tuple(first)), now=0.0)
    pending, running = apply(decisions, first, [], now=0.0)
    running = [
        w if rng.random() < 0.5 else _with_checkpoint(w, rng.choice([None, 500.0, 900.0]))
        for w in running
    ]
    pending += [job(100 + i, 100.0 + i) for i in range(draw(st.integers(0, 30)))]
    return World(nodes, quotas, pending, running, 1000.0, config)


def _with_checkpoint(w: Workload, at: float | None) -> Workload:
    from dataclasses import replace

    return replace(w, last_checkpoint_time=at)


def run(world: World, pending: list[Workload] | None = None) -> Decisions:
    snap = Snapshot(
        world.nodes, world.quotas, tuple(pending or world.pending), tuple(world.running)
    )
    return Scheduler(world.config).schedule(snap, world.now)


def usage(running: list[Workload]) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for w in running:
        assert w.placement is not None
        if w.placement.gpu_model:
            out[(w.queue, w.placement.gpu_model)] += w.total_gpus
    return out


@SETTINGS
@given(worlds())
def test_no_gpu_is_ever_allocated_twice(world: World) -> None:
    decisions = run(world)
    _, after = apply(decisions, world.pending, world.running, now=world.now, stop_victims=False)
    held = gpus_in_use(after)
    assert len(held) == len(set(held))
    by_name = {n.name: n for n in world.nodes}
    for node, gpu in held:
        assert 0 <= gpu < by_name[node].gpus_total
    for a in decisions.admissions:
        for node, ix in a.placement.gpus.items():
            assert by_name[node].schedulable
            assert not set(ix) & set(by_name[node].unavailable_gpus)


@SETTINGS
@given(worlds())
def test_gangs_are_all_or_nothing_with_exactly_the_shape_asked_for(world: World) -> None:
    decisions = run(world)
    by_id = {w.id: w for w in world.pending}
    models = {n.name: n.gpu_model for n in world.nodes}
    for a in decisions.admissions:
        w = by_id[a.workload_id]
        assert len(a.placement.gpus) == w.nodes
        assert all(len(ix) == w.gpus_per_node for ix in a.placement.gpus.values())
        assert {models[n] for n in a.placement.gpus} == {a.placement.gpu_model}
        if w.gpu_model:
            assert a.placement.gpu_model == w.gpu_model
    assert set(decisions.pending) | set(decisions.admitted) == set(by_id)
    assert not set(decisions.pending) & set(decisions.admitted)


@SETTINGS
@given(worlds())
def test_no_queue_goes_above_nominal_plus_what_it_may_borrow(world: World) -> None:
    decisions = run(world)
    _, after = apply(decisions, world.pending, world.running, now=world.now, stop_victims=False)
    before_use, after_use = usage(world.running), usage(after)
    models = {n.gpu_model for n in world.nodes if n.gpu_model}
    for model in models:
        total_nominal = sum(q.nominal.get(model, 0) for q in world.quotas.queues)
        total_after = sum(v for (q, m), v in after_use.items() if m == model)
        total_before = sum(v for (q, m), v in before_use.items() if m == model)
        assert total_after <= max(total_nominal, total_before)
        for q in world.quotas.queues:
            limit = q.borrowing_limit_for(model)
            grew = after_use[(q.name, model)] > before_use[(q.name, model)]
            if limit is not None and grew:
                assert after_use[(q.name, model)] <= q.nominal.get(model, 0) + limit


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_the_same_input_gives_the_same_decisions(world: World, rnd: random.Random) -> None:
    first = run(world)
    shuffled = list(world.pending)
    rnd.shuffle(shuffled)
    second = run(world, shuffled)
    assert first.admissions == second.admissions
    assert first.preemptions == second.preemptions
    assert first.reservations == second.reservations
    assert dict(first.pending) == dict(second.pending)


@SETTINGS
@given(worlds())
def test_a_victim_never_outranks_the_job_it_makes_room_for(world: World) -> None:
    decisions = run(world)
    running = {w.id: w for w in world.running}
    pending = {w.id: w for w in world.pending}
    use = usage(world.running)
    config = world.config
    for p in decisions.preemptions:
        victim, preemptor = running[p.workload_id], pending[p.preemptor_id]
        assert victim.preemptible and not victim.terminating
        assert victim.priority <= preemptor.priority or p.reason == "reclaim"
        if p.reason == "priority":
            assert victim.queue == preemptor.queue and victim.priority < preemptor.priority
        elif p.reason == "attained-service":
            v_level = config.service_level(victim.service_s(world.now) * victim.total_gpus)
            w_level = config.service_level(preemptor.attained_service_s * preemptor.total_gpus)
            assert victim.queue == preemptor.queue and v_level > w_level
        elif p.reason == "borrowed-service":
            # Another queue's long runner on borrowed quota, at equal priority and a higher
            # level; its queue keeps at least its nominal quota.
            v_level = config.service_level(victim.service_s(world.now) * victim.total_gpus)
            w_level = config.service_level(preemptor.attained_service_s * preemptor.total_gpus)
            assert victim.priority == preemptor.priority and v_level > w_level
            spec = world.quotas.queue(victim.queue)
            model = victim.placement.gpu_model  # type: ignore[union-attr]
            assert spec is not None
            assert use[(victim.queue, model)] - victim.total_gpus >= spec.nominal.get(model, 0)
        elif p.reason == "defragment":
            # A move, not a displacement: a smaller single-node job at no higher priority
            # and no lower service level than the gang it clears a node for.
            v_level = config.service_level(victim.service_s(world.now) * victim.total_gpus)
            w_level = config.service_level(preemptor.attained_service_s * preemptor.total_gpus)
            assert victim.nodes == 1 and victim.gpus_per_node < preemptor.gpus_per_node
            assert victim.priority <= preemptor.priority and v_level >= w_level
        else:
            assert p.reason == "reclaim" and victim.queue != preemptor.queue
            model = victim.placement.gpu_model  # type: ignore[union-attr]
            spec = world.quotas.queue(victim.queue)
            assert spec is not None and use[(victim.queue, model)] > spec.nominal.get(model, 0)
            mine = world.quotas.queue(preemptor.queue)
            assert mine is not None
            assert use[(preemptor.queue, model)] + preemptor.total_gpus <= mine.nominal.get(
                model, 0
            )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    lender_nominal=st.integers(1, 16),
    borrower_jobs=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=12),
    lender_shape=st.sampled_from(["single GPUs", "whole nodes"]),
    checkpoint_age=st.integers(0, 900),
)
def test_a_reclaimed_lender_gets_its_quota_back(
    lender_nominal: int, borrower_jobs: list[int], lender_shape: str, checkpoint_age: int
) -> None:
    """Whatever the borrower runs, the lender's work within its nominal quota gets admitted.

    Work that fragmentation alone could block (a 5-GPU job among borrowers' jobs that stay
    within their own quota) is out of scope: reclaim only takes back what was lent.
    """
    if lender_shape == "whole nodes":
        borrower_jobs = [8] * len(borrower_jobs)
        lender_nominal = max(8, lender_nominal - lender_nominal % 8)
    nodes = tuple(Node(f"n{i}", "H100", 8, 64.0, switch="s0") for i in range(3))
    quotas = QuotaConfig.build(
        [
            QueueSpec(name="lender", cohort="pool", nominal={"H100": lender_nominal}),
            QueueSpec(name="borrower", cohort="pool", nominal={"H100": 24 - lender_nominal}),
        ]
    )
    config = SchedulerConfig(preempt_by_service=False)
    scheduler = Scheduler(config)
    borrowers = [
        make_workload(f"b{i}", "borrower").gpus(g).submitted(i).obj()
        for i, g in enumerate(borrower_jobs)
    ]
    first = scheduler.schedule(Snapshot(nodes, quotas, tuple(borrowers)), now=0.0)
    _, running = apply(first, borrowers, [], now=0.0)
    running = [_with_checkpoint(w, float(1000 - checkpoint_age)) for w in running]
    if lender_shape == "whole nodes":
        mine = [
            make_workload(f"mine{i}", "lender").gpus(8).submitted(999).obj()
            for i in range(lender_nominal // 8)
        ]
    else:
        mine = [
            make_workload(f"mine{i}", "lender").gpus(1).submitted(999).obj()
            for i in range(lender_nominal)
        ]
    pending = list(mine)
    now = 1000.0
    for _ in range(4):
        decisions = scheduler.schedule(Snapshot(nodes, quotas, tuple(pending), tuple(running)), now)
        assert all(p.reason == "reclaim" for p in decisions.preemptions)
        pending, running = apply(decisions, pending, running, now=now)
        if not pending:
            break
        now += config.preemption_grace_s
    held = sum(w.total_gpus for w in running if w.queue == "lender")
    assert held == lender_nominal, f"lender holds {held} of its {lender_nominal}"
