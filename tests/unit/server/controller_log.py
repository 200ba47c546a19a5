"""A decision log of the control loop: scripted scenarios driven one cycle at a time, with a
fixed clock, a real SQLite store and the scripted executor of test_controller.py, recording
per cycle every job's changes (state, reason, placement, attempts, restarts, why-pending,
start estimate), every new event and every executor call (launches with their environment,
cancels, kills, in-place restarts, stack dumps).

``test_controller_replay.py`` compares each scenario's log with ``controller_baseline.json``,
recorded before the controller was split by concern. Re-record (only for an intended change
of behaviour, in its own commit) with::

    TYARD_RECORD_CONTROLLER_BASELINE=1 pytest tests/unit/server/test_controller_replay.py
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from test_controller import Clock, ScriptedExecutor, World, store_home

from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.server.config import ServerConfig
from tensoryard.server.controller import Controller
from tensoryard.server.scheduling import CorePolicy, NodeCapacity
from tensoryard.store import Store

BASELINE = Path(__file__).with_name("controller_baseline.json")

_KEY_SUFFIX = re.compile(r"(j\d+-a\d+)-[0-9a-f]{12}")
_ENV_RECORDED = (
    "TYARD_ATTEMPT",
    "TYARD_CHECKPOINT_INTERVAL",
    "TYARD_CHECKPOINT_ASYNC",
    "TYARD_CHECKPOINT_LAYOUT",
    "TYARD_CHECKPOINT_KEEP",
    "TYARD_IN_PLACE_RESTARTS",
)


class Cluster:
    """The executor's nodes, changed by a scenario (a node deleted, NotReady, back)."""

    def __init__(self, *names: str, cpu: int = 4) -> None:
        self.nodes = {n: NodeCapacity(n, cpu_slots=cpu, memory_bytes=64 * 2**30) for n in names}

    def __call__(self) -> tuple[NodeCapacity, ...]:
        return tuple(self.nodes.values())


@dataclass
class Recorder:
    """What changed since the last look, as plain JSON-able rows."""

    world: World
    tmp: str
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_event: int = 0
    seen: dict[str, int] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)

    def text(self, value: str) -> str:
        return _KEY_SUFFIX.sub(r"\1-KEY", value.replace(self.tmp, "<tmp>"))

    def note(self, step: str) -> None:
        store, ex = self.world.store, self.world.executor
        entry: dict[str, Any] = {"step": step, "t": self.world.clock.t - 1_000_000.0}
        changes = {}
        for job in sorted(store.list_jobs(limit=1000).items, key=lambda j: j.id):
            row = {
                "state": job.state.value,
                "reason": self.text(job.reason),
                "attempts": job.attempts,
                "restarts": job.restarts,
                "placement": {n: list(g) for n, g in sorted(job.placement.items())},
                "pending_reason": self.text(job.pending_reason),
                "pending_eta": job.pending_eta.timestamp() if job.pending_eta else None,
                "cancel_requested": job.cancel_requested,
                "run_time_s": round(job.run_time_s, 3),
            }
            old = self.jobs.get(job.id, {})
            diff = {k: v for k, v in row.items() if old.get(k) != v}
            if diff:
                changes[str(job.id)] = diff
            self.jobs[job.id] = row
        if changes:
            entry["jobs"] = changes
        events = []
        for job_id in sorted(self.jobs):
            for e in store.list_events(job_id):
                if e.id > self.last_event:
                    events.append([e.id, e.job_id, e.kind, e.attempt, self.text(e.message)])
        events.sort()
        if events:
            self.last_event = events[-1][0]
            entry["events"] = [e[1:] for e in events]
        calls = {
            "launches": [
                {
                    "job": r.job_id,
                    "attempt": r.attempt,
                    "key": self.text(r.attempt_key),
                    "placement": {n: list(g) for n, g in sorted(r.placement.items())},
                    "in_place": r.in_place_restarts,
                    "epoch": r.fencing_epoch,
                    "command": list(r.spec.command),
                    "env": {k: r.env[k] for k in _ENV_RECORDED if k in r.env},
                }
                for r in ex.requests
            ],
            "cancels": [[self.text(k), g] for k, g in ex.cancels],
            "terminated": [self.text(k) for k in ex.terminated],
            "worker_restarts": [self.text(k) for k in ex.worker_restarts],
            "stack_dumps": [self.text(k) for k in ex.stack_dumps],
        }
        for name, rows in calls.items():
            new = rows[self.seen.get(name, 0) :]
            self.seen[name] = len(rows)
            if new:
                entry[name] = new
        self.log.append(entry)


@dataclass
class Scenario:
    world: World
    cluster: Cluster
    rec: Recorder
    config: ServerConfig

    def controller(self) -> Controller:
        return Controller(
            store=self.world.store,
            executor=self.world.executor,  # type: ignore[arg-type]
            policy=CorePolicy(),
            capacity=self.cluster,
            config=self.config,
            clock=self.world.clock,
            job_key="k",
            holder="replica-a",
        )

    def cycle(self, n: int = 1, advance: float = 0.0, note: str = "cycle") -> None:
        for _ in range(n):
            self.world.clock.t += advance
            self.world.controller.cycle()
            self.rec.note(note)

    def restart_control_plane(self) -> None:
        self.world.controller = self.controller()
        assert self.world.controller.lead()
        self.rec.note("restart")

    def finish(self, job_id: int, phase: AttemptPhase, reason: str = "") -> None:
        self.world.executor.finish(self.world.key(job_id), phase, reason)


def make_scenario(url: str, tmp_path: Path, *nodes: str, **config: Any) -> Scenario:
    clock = Clock()
    store = Store.open(url, clock=clock.dt)
    store.ensure_team("default")
    executor = ScriptedExecutor(store)
    cluster = Cluster(*nodes)
    cfg = ServerConfig(
        home=store_home(store),
        launch_workers=0,
        cancel_grace_s=5,
        starting_timeout_s=60,
        poll_failure_grace_s=30,
        heartbeat_timeout_s=120,
        **config,
    )
    world = World(store, executor, clock, None, tmp_path)  # type: ignore[arg-type]
    scenario = Scenario(world, cluster, Recorder(world, str(tmp_path)), cfg)
    world.controller = scenario.controller()
    assert world.controller.lead()
    scenario.rec.note("lead")
    return scenario


# ---- the scenarios ------------------------------------------------------------------------


def submits_and_successes(s: Scenario) -> None:
    w = s.world
    a = w.submit("a", resources={"cpu": 2})
    b = w.submit("b", resources={"cpu": 2}, priority=5)
    c = w.submit("c", resources={"cpu": 4})  # waits for both
    s.cycle(2)
    s.finish(a, AttemptPhase.SUCCEEDED)
    s.cycle(advance=10)
    s.finish(b, AttemptPhase.SUCCEEDED)
    s.cycle(3, advance=5)
    s.finish(c, AttemptPhase.SUCCEEDED)
    s.cycle(2, advance=5)


def failures_with_restarts(s: Scenario) -> None:
    w = s.world
    job = w.submit("flaky", restart={"max_restarts": 2, "backoff": "10s"})
    bad = w.submit("config", restart={"max_restarts": 3})
    once = w.submit("no-budget", restart={"max_restarts": 0})
    s.cycle(2)
    w.store.add_checkpoint(job, 1, step=100, path="c100", ts=w.clock.t)
    s.finish(job, AttemptPhase.FAILED, "rank 0 exited with code 1")
    w.executor.statuses[w.key(bad)] = [AttemptStatus(AttemptPhase.FAILED, 78, "bad config")]
    s.finish(once, AttemptPhase.FAILED, "rank 0 exited with code 1")
    s.cycle(advance=5)
    s.cycle(2, advance=6)  # backoff passed: attempt 2
    s.finish(job, AttemptPhase.FAILED, "NCCL timeout")
    s.cycle(3, advance=11)
    s.finish(job, AttemptPhase.FAILED, "NCCL timeout")
    s.cycle(3, advance=11)  # no restarts left


def a_hang(s: Scenario) -> None:
    w = s.world
    hung = w.submit("hung", health={"min_stall": "60s", "stall_factor": 10})
    warn = w.submit("warn", health={"heartbeat_timeout": "50s", "on_hang": "warn"})
    torch = w.submit(
        "torch",
        launcher="torchrun",
        restart={"in_place": 1, "max_restarts": 2},
        health={"heartbeat_timeout": "50s"},
    )
    s.cycle(2)
    rows = [{"step": k, "ts": w.clock.t + k, "values": {"loss": 1.0}} for k in range(1, 6)]
    w.store.add_metrics(hung, 1, rows)
    for job in (hung, warn, torch):
        w.store.heartbeat(job, 1, w.clock.dt())
    w.executor.stacks = {0: "Thread 1:\n  File 'x.py', line 3, in allreduce"}
    s.cycle(advance=30)
    w.store.heartbeat(hung, 1, datetime.fromtimestamp(w.clock.t + 40, UTC))
    s.cycle(advance=40)
    s.cycle(advance=10)
    s.finish(hung, AttemptPhase.CANCELLED)
    s.cycle(3, advance=5)
    s.cycle(2, advance=130)  # the in-place restarted workers never report
    s.finish(torch, AttemptPhase.CANCELLED)
    s.cycle(3, advance=5)


def a_drain(s: Scenario) -> None:
    w = s.world
    first = w.submit("first", resources={"cpu": 4})
    second = w.submit("second", resources={"cpu": 4})
    s.cycle(2)
    node = next(iter(w.store.get_job(first).placement))
    w.store.set_node_state(node, "draining", reason="XID 79 on GPU 2", actor="agent")
    s.cycle(2, advance=2)
    s.finish(first, AttemptPhase.CANCELLED)
    s.cycle(3, advance=1)
    s.finish(second, AttemptPhase.SUCCEEDED)
    s.cycle(3, advance=1)


def a_lost_node(s: Scenario) -> None:
    w = s.world
    job = w.submit(
        "gang", launcher="torchrun", resources={"nodes": 2, "cpu": 4}, restart={"backoff": "0s"}
    )
    other = w.submit("single", resources={"cpu": 4})
    s.cycle(2)
    w.store.add_checkpoint(job, 1, step=1200, path="c1200", ts=w.clock.t)

    def lose(name: str, why: str) -> None:
        w.executor.statuses[w.key(job)] = [
            AttemptStatus(AttemptPhase.FAILED, None, why, (1,), lost_nodes=(name,))
        ]

    first = sorted(w.store.get_job(job).placement)[1]
    del s.cluster.nodes[first]  # the Node object was deleted: a spare takes its place
    lose(first, f"node {first} deleted under rank 1")
    s.cycle(3, advance=1)
    second = sorted(w.store.get_job(job).placement)[0]
    s.cluster.nodes[second] = NodeCapacity(
        second, cpu_slots=4, memory_bytes=64 * 2**30, cordoned=True
    )  # NotReady, and no spare left: the gang waits for a replacement
    lose(second, f"node {second} NotReady since 12:01:03Z under rank 0")
    s.cycle(3, advance=1)
    s.cluster.nodes[second] = NodeCapacity(second, cpu_slots=4, memory_bytes=64 * 2**30)
    s.cycle(3, advance=61)
    s.cluster.nodes[first] = NodeCapacity(first, cpu_slots=4, memory_bytes=64 * 2**30)
    s.finish(other, AttemptPhase.SUCCEEDED)
    s.cycle(3, advance=1)


def a_preemption(s: Scenario) -> None:
    w = s.world
    low = w.submit("low", resources={"cpu": 4})
    s.cycle(2)
    w.clock.t += 600
    w.store.heartbeat(low, 1, w.clock.dt())
    w.store.add_checkpoint(low, 1, step=50, path="c50", ts=w.clock.t - 100)
    high = w.submit("high", priority=10, resources={"cpu": 4})
    s.cycle()
    s.cycle(advance=1)
    s.finish(low, AttemptPhase.CANCELLED)
    s.cycle(3, advance=1)
    s.finish(high, AttemptPhase.SUCCEEDED)
    s.cycle(3, advance=1)


def cancels_and_a_restart(s: Scenario) -> None:
    w = s.world
    running = w.submit("running", resources={"cpu": 4})
    stuck = w.submit("stuck", resources={"cpu": 2})
    waiting = w.submit("waiting", resources={"cpu": 4})
    s.cycle(2)
    w.store.request_cancel(waiting)
    w.store.request_cancel(running)
    s.cycle(advance=1)
    s.finish(running, AttemptPhase.CANCELLED)
    s.cycle(2, advance=1)
    later = w.submit("later", resources={"cpu": 2})
    s.cycle(2, advance=1)
    w.executor.statuses[w.key(later)] = [RuntimeError("executor bug")]
    s.cycle(4, advance=1)
    s.restart_control_plane()
    s.cycle(2, advance=1)
    w.executor.default = AttemptStatus(AttemptPhase.STARTING, reason="image pull backoff")
    again = w.submit("slow", resources={"cpu": 1})
    s.cycle(3, advance=1)
    s.cycle(advance=61)
    s.finish(again, AttemptPhase.CANCELLED)
    s.cycle(2, advance=1)
    w.store.request_cancel(stuck)
    s.cycle(2, advance=1)


SCENARIOS: dict[str, tuple[Callable[[Scenario], None], tuple[str, ...]]] = {
    "submits and successes": (submits_and_successes, ("n1",)),
    "failures with restarts": (failures_with_restarts, ("n1",)),
    "a hang": (a_hang, ("n1",)),
    "a drain": (a_drain, ("n1", "n2")),
    "a lost node": (a_lost_node, ("n1", "n2", "n3", "n4")),
    "a preemption": (a_preemption, ("n1",)),
    "cancels and a restart of the control plane": (cancels_and_a_restart, ("n1", "n2")),
}


def run(name: str, url: str, tmp_path: Path) -> list[dict[str, Any]]:
    script, nodes = SCENARIOS[name]
    scenario = make_scenario(url, tmp_path, *nodes)
    try:
        script(scenario)
    finally:
        scenario.world.store.close()
    return scenario.rec.log
