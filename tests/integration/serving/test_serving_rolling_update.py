"""Rolling update when an alias moves: real replica processes (the mock engine: the point is
the supervisor, not a model), the real store (SQLite and PostgreSQL) and the real supervisor
thread with its alias follower. A client keeps sending requests through the supervisor's
`acquire` during the update; none may fail, and the old replicas stop only once the new ones
answer."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tensoryard.registry import ArtifactStore, open_blobs
from tensoryard.serving.deploy import Deployer
from tensoryard.serving.plane import ServingPlane
from tensoryard.serving.replicas import ReplicaManager, default_command
from tensoryard.spec.deployment import DeploymentSpec
from tensoryard.store import Store
from tensoryard.store._serving import RETIRING_SLOT, DeploymentRecord

pytestmark = pytest.mark.slow

NAME = "m-serve"


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of this test process counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait(probe: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Traffic:
    """Requests in a loop through the supervisor, as the gateway sends them."""

    manager: ReplicaManager
    served_by: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self.stop.is_set():
                try:
                    replica, _ = asyncio.run(self.manager.acquire(NAME, "hello", timeout_s=20))
                except Exception as exc:
                    self.failures.append(f"acquire: {exc!r}")
                    continue
                failed = False
                try:
                    resp = http.post(
                        replica.url + "/v1/completions",
                        json={"model": NAME, "prompt": "hello", "max_tokens": 2},
                    )
                    if resp.status_code != 200:
                        failed = True
                        self.failures.append(f"{replica.id}: HTTP {resp.status_code}")
                    else:
                        assert replica.pid is not None
                        self.served_by.append(replica.pid)
                except httpx.HTTPError as exc:
                    failed = True
                    self.failures.append(f"{replica.id}: {exc!r}")
                finally:
                    self.manager.release(replica, failed=failed)


@dataclass
class World:
    store: Store
    artifacts: ArtifactStore
    tmp: Path
    planes: list[ServingPlane] = field(default_factory=list)

    def plane(
        self, command_for: Callable[[DeploymentRecord, int], list[str]] = default_command
    ) -> ServingPlane:
        plane = ServingPlane.build(
            self.store,
            CollectorRegistry(),
            log_dir=self.tmp / "serving",
            artifacts=self.artifacts,
            command_for=command_for,
        )
        plane.manager.start()
        self.planes.append(plane)
        return plane

    def register(self, content: bytes) -> int:
        src = self.tmp / f"w-{len(content)}.bin"
        src.write_bytes(content)
        pushed = self.artifacts.push(src)
        return self.store.register_version(
            "default",
            "m",
            artifact=pushed.manifest.digest,
            size_bytes=pushed.manifest.total_bytes,
            created_by="admin",
            aliases=["production"],
        ).version

    def deploy(self, plane: ServingPlane, replicas: int = 2) -> None:
        deployer = Deployer(self.store, plane.weights, plane.manager, gateway_url="http://x")
        spec = DeploymentSpec(model="m@production", name=NAME, engine="mock", replicas=replicas)
        deployer.apply(deployer.plan("default", spec), created_by="admin")

    def ready_pids(self, *, new: bool = True) -> list[int | None]:
        """Pids of the ready replicas of the current version (new) or the retiring ones."""
        rows = self.store.list_replicas(NAME)
        if new:
            return [r.pid for r in rows if r.state == "ready" and r.slot < RETIRING_SLOT]
        return [r.pid for r in rows if r.state == "retiring"]


@pytest.fixture
def world(store: Store, tmp_path: Path) -> Iterator[World]:
    store.ensure_team("default")
    w = World(store, ArtifactStore(open_blobs(str(tmp_path / "artifacts"))), tmp_path)
    yield w
    for plane in w.planes:
        plane.manager.stop()


def test_an_alias_move_rolls_the_replicas_over_without_failing_a_request(world: World) -> None:
    world.register(b"weights v1")
    plane = world.plane()
    world.deploy(plane, replicas=2)
    old = wait(lambda: len(world.ready_pids()) == 2 and world.ready_pids(), "2 ready replicas")
    traffic = Traffic(plane.manager)
    client = threading.Thread(target=traffic.run, daemon=True)
    client.start()
    wait(lambda: len(traffic.served_by) > 20, "requests served before the update")

    assert world.register(b"weights v2") == 2  # moves `production` to version 2
    rec = wait(
        lambda: "(version 2)" in (d := world.store.get_deployment(NAME)).model_ref and d,
        "the follower to update the deployment",
        timeout=20,
    )
    assert rec.model_ref == "m@production (version 2)"
    assert rec.replicas == 2 and rec.engine == "mock"
    # the old replicas kept their processes and retire only after the new ones answer
    new = wait(
        lambda: (
            len(world.ready_pids()) == 2 and not world.ready_pids(new=False) and world.ready_pids()
        ),
        "the new replicas ready and the old ones retired",
    )
    assert not set(new) & set(old)
    wait(lambda: not any(_alive(p) for p in old), "the old processes to exit", timeout=20)
    served_before = len(traffic.served_by)
    wait(lambda: len(traffic.served_by) > served_before + 20, "requests after the update")
    traffic.stop.set()
    client.join(timeout=30)

    assert traffic.failures == []
    assert set(traffic.served_by) <= set(old) | set(new)
    assert set(old) & set(traffic.served_by) and set(new) & set(traffic.served_by)
    last = traffic.served_by[-20:]
    assert set(last) <= set(new)  # once retired, an old replica gets no request


def test_new_replicas_that_never_answer_leave_the_old_ones_serving(world: World) -> None:
    def broken_v2(rec: DeploymentRecord, port: int) -> list[str]:
        if "(version 2)" in rec.model_ref:
            return ["python3", "-c", "import sys; sys.exit('cannot load weights v2')"]
        return default_command(rec, port)

    world.register(b"weights v1")
    plane = world.plane(broken_v2)
    world.deploy(plane, replicas=1)
    (old,) = wait(lambda: world.ready_pids(), "a ready replica")
    world.register(b"weights v2")
    wait(lambda: "(version 2)" in world.store.get_deployment(NAME).model_ref, "the update")
    time.sleep(3)  # the new replica fails and restarts with backoff meanwhile

    assert world.ready_pids(new=False) == [old] and _alive(old)
    traffic = Traffic(plane.manager)
    client = threading.Thread(target=traffic.run, daemon=True)
    client.start()
    wait(lambda: len(traffic.served_by) >= 5, "requests served by the old version")
    traffic.stop.set()
    client.join(timeout=30)
    assert traffic.failures == [] and set(traffic.served_by) == {old}


def test_a_control_plane_that_dies_mid_update_finishes_it_and_leaks_no_process(
    world: World,
) -> None:
    world.register(b"weights v1")
    first = world.plane()
    world.deploy(first, replicas=2)
    old = wait(lambda: len(world.ready_pids()) == 2 and world.ready_pids(), "2 ready replicas")
    first.manager.follow = None  # this process dies before it acts on the moved alias
    first.manager.stop(stop_replicas=False)  # SIGKILL of the control plane: replicas live on
    world.planes.remove(first)

    world.register(b"weights v2")
    second = world.plane()  # the restarted control plane
    wait(lambda: "(version 2)" in world.store.get_deployment(NAME).model_ref, "the update")
    new = wait(
        lambda: (
            len(world.ready_pids()) == 2 and not world.ready_pids(new=False) and world.ready_pids()
        ),
        "the update finished by the restarted control plane",
    )
    assert "(version 2)" in world.store.get_deployment(NAME).model_ref
    assert not set(new) & set(old)
    wait(lambda: not any(_alive(p) for p in old), "the old processes to exit", timeout=20)
    assert len(second.manager.replicas(NAME)) == 2


def test_the_update_moves_serving_rows_to_retiring_slots_in_one_transaction(
    world: World,
) -> None:
    world.register(b"weights v1")
    store = world.store
    store.create_deployment(
        NAME,
        team="default",
        model_ref="m@production (version 1)",
        model_path="",
        engine="mock",
        replicas=3,
        options={"router": "prefix"},
        idle_timeout_s=None,
        created_by="admin",
    )
    store.put_replica(NAME, 0, port=7000, state="ready", pid=100)
    store.put_replica(NAME, 1, port=7001, state="starting", pid=101)
    store.put_replica(NAME, 2, port=7002, state="ready", pid=102)
    store.update_deployment(
        NAME,
        team="default",
        model_ref="m@production (version 2)",
        model_path="",
        engine="mock",
        replicas=3,
        options={"router": "prefix"},
        idle_timeout_s=None,
    )
    rows = {r.slot: (r.state, r.pid, r.port) for r in store.list_replicas(NAME)}
    # serving replicas hand over; one still starting has nothing to hand over
    assert rows == {
        RETIRING_SLOT + 0: ("retiring", 100, 7000),
        RETIRING_SLOT + 2: ("retiring", 102, 7002),
    }
