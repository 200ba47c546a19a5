"""The pipeline advancer's deploy step on a real store (SQLite and PostgreSQL) with the real
replica supervisor running mock-engine processes: a control plane that dies at the deploy step
(after recording the intent, or after creating the deployment) never makes a second
deployment nor restarts the replicas; a moved alias updates the deployment; a missing model
or alias, a replica that cannot start and a name owned by another team fail the step with the
reason."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.server.pipelines import PipelineAdvancer
from tensoryard.serving.deploy import Deployer, PlannedDeployment
from tensoryard.serving.metrics import ServingMetrics
from tensoryard.serving.plane import ServingPlane
from tensoryard.serving.replicas import ReplicaManager, default_command
from tensoryard.spec.pipeline import parse_pipeline_spec
from tensoryard.store import PipelineRecord, Store
from tensoryard.store._serving import DeploymentRecord

pytestmark = pytest.mark.slow

GATEWAY = "http://127.0.0.1:8600"


class ControlPlaneDied(Exception):
    """Raised where the control plane's process would have been killed."""


class DiesBeforeApplying(Deployer):
    def apply(self, plan: PlannedDeployment, *, created_by: str) -> Any:
        raise ControlPlaneDied("killed after the step was marked RUNNING")


@dataclass
class World:
    store: Store
    plane: ServingPlane
    artifacts: ArtifactStore
    runs: Path

    def deployer(self, cls: type[Deployer] = Deployer) -> Deployer:
        return cls(self.store, self.plane.weights, self.plane.manager, gateway_url=GATEWAY)

    def advancer(self, deployer: Deployer | None = None) -> PipelineAdvancer:
        """A fresh advancer: what a restarted control plane builds."""
        return PipelineAdvancer(
            self.store, runs_dir=self.runs, deployer=deployer or self.deployer()
        )

    def register(self, model: str, content: bytes, *, aliases: list[str]) -> int:
        src = self.runs / f"{model}-{len(content)}.bin"
        src.write_bytes(content)
        pushed = self.artifacts.push(src)
        return self.store.register_version(
            "default",
            model,
            artifact=pushed.manifest.digest,
            size_bytes=pushed.manifest.total_bytes,
            created_by="admin",
            aliases=aliases,
        ).version

    def start(self, **deploy: Any) -> int:
        body = {"model": "m@production", "engine": "mock", "name": "m-serve", **deploy}
        spec = parse_pipeline_spec(
            {"name": "ship", "steps": [{"name": "deploy", "kind": "deploy", "deploy": body}]}
        )
        return self.store.create_pipeline(spec, {}).id

    def until_done(
        self, advancer: PipelineAdvancer, pid: int, timeout: float = 60
    ) -> PipelineRecord:
        deadline = time.monotonic() + timeout
        while True:
            advancer.advance()
            record = self.store.get_pipeline(pid)
            if record.state != "RUNNING":
                return record
            assert time.monotonic() < deadline, record
            time.sleep(0.1)


@pytest.fixture
def world(store: Store, tmp_path: Path) -> Iterator[World]:
    store.ensure_team("default")
    artifacts = ArtifactStore(open_blobs(str(tmp_path / "artifacts")))
    plane = ServingPlane.build(
        store, CollectorRegistry(), log_dir=tmp_path / "serving", artifacts=artifacts
    )
    plane.manager.start()
    runs = tmp_path / "runs"
    runs.mkdir()
    yield World(store, plane, artifacts, runs)
    plane.manager.stop()


def pids(store: Store, name: str) -> list[int | None]:
    return [r.pid for r in store.list_replicas(name)]


def test_a_control_plane_dying_at_the_deploy_step_makes_one_deployment_and_keeps_its_replicas(
    world: World,
) -> None:
    store = world.store
    assert world.register("m", b"weights v1", aliases=["production"]) == 1
    first = world.start(replicas=2)

    # 1. the step is marked RUNNING (intent, with the resolved version), then the process dies
    world.advancer(world.deployer(DiesBeforeApplying)).advance()
    step = store.get_pipeline(first).step("deploy")
    assert step.state == "RUNNING" and step.started_at is not None
    assert step.outputs["deployment"] == "m-serve" and step.outputs["version"] == 1
    assert store.list_deployments() == []

    # 2. a restarted control plane creates it, then dies again before the replicas are ready
    restarted = world.advancer()
    restarted.advance()
    assert [d.name for d in store.list_deployments()] == ["m-serve"]
    assert store.get_pipeline(first).step("deploy").state == "RUNNING"

    # 3. a third process applies again (nothing to change) and waits for readiness
    done = world.until_done(world.advancer(), first)
    assert done.state == "SUCCEEDED", done.reason
    step = done.step("deploy")
    assert step.state == "SUCCEEDED", step.reason
    assert step.outputs == {
        "deployment": "m-serve",
        "gateway_model": "m-serve",
        "endpoint": f"{GATEWAY}/v1",
        "model": "m",
        "version": 1,
        "engine": "mock",
        "replicas": 2,
        "ready_replicas": 2,
    }
    assert "deployment m-serve ready: 2 of 2 replica(s)" in step.reason
    deployments = store.list_deployments()
    assert len(deployments) == 1 and deployments[0].model_ref == "m@production (version 1)"
    running = pids(store, "m-serve")
    assert len(running) == 2 and None not in running

    # 4. the same pipeline run again: the deployment already serves version 1, nothing restarts
    again = world.until_done(world.advancer(), world.start(replicas=2))
    assert again.state == "SUCCEEDED", again.reason
    assert pids(store, "m-serve") == running
    assert len(store.list_deployments()) == 1


def test_a_moved_alias_updates_the_deployment_and_rolls_its_replicas_over(world: World) -> None:
    store = world.store
    world.register("m", b"weights v1", aliases=["production"])
    first = world.until_done(world.advancer(), world.start())
    assert first.state == "SUCCEEDED", first.reason
    before = pids(store, "m-serve")

    assert world.register("m", b"weights v2", aliases=["production"]) == 2
    second = world.until_done(world.advancer(), world.start())
    assert second.state == "SUCCEEDED", second.reason
    assert second.step("deploy").outputs["version"] == 2
    deployment = store.get_deployment("m-serve")
    assert deployment.model_ref == "m@production (version 2)"
    # a rolling update: the old replica answers until the new one is ready, then it retires
    deadline = time.monotonic() + 30
    while len(after := pids(store, "m-serve")) != 1:
        assert time.monotonic() < deadline, store.list_replicas("m-serve")
        time.sleep(0.1)
    assert after != before
    assert len(store.list_deployments()) == 1


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("m@nope", "cannot deploy m@nope: "),
        ("nope@production", "cannot deploy nope@production: "),
        ("m:7", "cannot deploy m:7: "),
    ],
    ids=["an alias that does not exist", "a model that does not exist", "a missing version"],
)
def test_a_missing_model_alias_or_version_fails_the_step_and_deploys_nothing(
    world: World, model: str, message: str
) -> None:
    world.register("m", b"weights v1", aliases=["production"])
    done = world.until_done(world.advancer(), world.start(model=model))
    step = done.step("deploy")
    assert done.state == "FAILED" and step.state == "FAILED"
    assert step.reason.startswith(message), step.reason
    assert "tyard models show default/" in step.reason  # the fix
    assert world.store.list_deployments() == []


def test_a_replica_that_cannot_start_fails_the_step_with_its_reason(world: World) -> None:
    world.register("m", b"weights v1", aliases=["production"])
    done = world.until_done(
        world.advancer(), world.start(options={"no_such_flag": 1}, max_restarts=0)
    )
    step = done.step("deploy")
    assert step.state == "FAILED", step.reason
    assert "replica 0 of deployment m-serve exited 1 time(s) while starting" in step.reason
    assert "unrecognized arguments: --no_such_flag=1" in step.reason  # from the replica's log


def test_a_deployment_name_of_another_team_is_not_taken_over(world: World) -> None:
    store = world.store
    store.ensure_team("vision")
    store.create_deployment(
        "m-serve",
        team="vision",
        model_ref="theirs",
        model_path="",
        engine="mock",
        replicas=0,
        options={},
        idle_timeout_s=None,
        created_by="vic",
    )
    world.register("m", b"weights v1", aliases=["production"])
    done = world.until_done(world.advancer(), world.start())
    step = done.step("deploy")
    assert step.state == "FAILED"
    assert "deployment 'm-serve' belongs to team 'vision'" in step.reason
    assert store.get_deployment("m-serve").model_ref == "theirs"


def test_a_deployment_not_ready_in_time_or_deleted_meanwhile_fails_the_step(world: World) -> None:
    store = world.store
    world.register("m", b"weights v1", aliases=["production"])
    an_hour_later = PipelineAdvancer(
        store,
        runs_dir=world.runs,
        deployer=world.deployer(),
        clock=lambda: datetime.now(UTC) + timedelta(hours=1),
    )
    late = world.until_done(an_hour_later, world.start(ready_timeout_s=60))
    reason = late.step("deploy").reason
    assert late.state == "FAILED" and "deployment m-serve not ready after 36" in reason, reason
    assert "(ready_timeout_s 60): 0 of 1 replica(s) ready" in reason

    advancer = world.advancer()
    gone = world.start(name="m-other")
    advancer.advance()
    waiting = store.get_pipeline(gone).step("deploy")
    assert waiting.state == "RUNNING"
    assert waiting.reason == "deploying m version 1 as m-other: 0 of 1 replica(s) ready"
    store.delete_deployment("m-other")
    done = world.until_done(advancer, gone)
    assert (
        done.step("deploy").reason == "deployment m-other was deleted while the step waited for it"
    )


def _engines_on(port: int) -> list[int]:
    """Pids of live mock-engine processes listening on ``port`` (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = b"tensoryard.serving.mock_engine" in argv and str(port).encode() in argv
        if ours and state != "Z":
            found.append(int(proc.name))
    return found


def test_a_deployment_deleted_while_its_replica_starts_leaves_no_process(
    store: Store, tmp_path: Path
) -> None:
    """The race a CI run left two mock engines behind from: the deployment is deleted after the
    replica's intent row and before its pid is recorded. The process is stopped at once."""
    store.ensure_team("default")
    ports: list[int] = []

    def deleted_meanwhile(rec: DeploymentRecord, port: int) -> list[str]:
        store.delete_deployment(rec.name)  # e.g. `tyard deployments delete` right now
        ports.append(port)
        return default_command(rec, port)

    manager = ReplicaManager(
        store,
        log_dir=tmp_path / "serving",
        metrics=ServingMetrics(CollectorRegistry()),
        command_for=deleted_meanwhile,
    )
    store.create_deployment(
        "racy",
        team="default",
        model_ref="m",
        model_path=str(tmp_path / "m.gguf"),
        engine="mock",
        replicas=1,
        options={},
        idle_timeout_s=None,
        created_by="admin",
    )
    try:
        manager.reconcile()  # intent row, process, then the pid row finds no deployment
        (port,) = ports
        assert manager.replicas("racy") == []
        assert _engines_on(port) == []  # stopped, not left behind
        manager.reconcile()  # the next pass forgets the deployment without an error
        assert manager.deployments() == [] and store.list_replicas("racy") == []
    finally:
        manager.stop()
        for pid in _engines_on(ports[0]) if ports else []:
            os.kill(pid, signal.SIGKILL)
