"""Checkpoint retention and artifact GC through the REST API (real store: SQLite and
PostgreSQL; the app through its test client): a job's policy applied as its runtime reports
checkpoints, re-sent reports, the removal list, and the admin-only GC endpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane
from tensoryard.store import Retirement, Store
from tensoryard.store.models import Base

SPEC = {
    "name": "pretrain",
    "command": ["train.py"],
    "launcher": "python",
    "checkpoint": {"keep": 1, "keep_best": {"metric": "eval_loss", "mode": "min"}},
}


def _truncate(url: str) -> None:
    with Store.open(url) as store, store.engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlPlane]:
    db_url = None
    if request.param == "postgres":
        db_url = request.getfixturevalue("pg_url")
        _truncate(db_url)
    config = ServerConfig(home=tmp_path / "home", db_url=db_url, artifact_gc_grace_s=0.0)
    cp = build_control_plane(config)
    yield cp
    cp.store.close()


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[TestClient]:
    with TestClient(plane.app()) as client:
        client.headers["Authorization"] = f"Bearer {plane.admin_token}"
        yield client


def _report(
    api: TestClient, job: dict[str, Any], token: str, step: int, eval_loss: float
) -> dict[str, Any]:
    """What the runtime sends after an eval and a checkpoint at `step`."""
    path = Path(job["run_dir"]) / "checkpoints" / f"step-{step:09d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "state.pt").write_bytes(b"w" * 4096)
    now = time.time()
    body = {
        "attempt": 1,
        "metrics": [{"step": step, "ts": now, "values": {"eval_loss": eval_loss}}],
        "checkpoints": [{"step": step, "path": str(path), "ts": now, "size_bytes": 4096}],
    }
    response = api.post(
        f"/api/v1/jobs/{job['id']}/report", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    return body


def test_each_reported_checkpoint_applies_the_jobs_policy_and_resends_change_nothing(
    api: TestClient, plane: ControlPlane
) -> None:
    job = api.post("/api/v1/jobs", json={"spec": SPEC}).json()
    plane.store.start_attempt(job["id"], handle={})
    token = plane.store.issue_job_token(job["id"], attempt=1)
    losses = {100: 3.0, 200: 1.0, 300: 2.0, 400: 2.5}
    bodies = {step: _report(api, job, token, step, loss) for step, loss in losses.items()}

    kept = api.get(f"/api/v1/jobs/{job['id']}/checkpoints").json()
    assert [c["step"] for c in kept] == [200, 400]  # best eval_loss, newest
    ckpt_dir = Path(job["run_dir"]) / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-000000200", "step-000000400"]
    removed = api.get(f"/api/v1/jobs/{job['id']}/checkpoint-removals").json()
    assert [(r["step"], r["removed_at"] is not None) for r in removed] == [(100, True), (300, True)]
    events = [e["message"] for e in api.get(f"/api/v1/jobs/{job['id']}/events").json()]
    retention = [m for m in events if m.startswith("retention:")]
    assert retention[0].startswith("retention: deleted step 100 (policy: last 1, best 1 by")
    assert retention[1].startswith("retention: deleted step 300")
    assert "200 (best 1 by eval_loss)" in retention[1]

    resent = api.post(
        f"/api/v1/jobs/{job['id']}/report",
        json=bodies[100],
        headers={"Authorization": f"Bearer {token}"},
    )
    assert resent.status_code == 200
    assert [c["step"] for c in api.get(f"/api/v1/jobs/{job['id']}/checkpoints").json()] == [
        200,
        400,
    ]


def _random_dir(path: Path, size: int, seed: int) -> Path:
    path.mkdir(parents=True)
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    (path / "w.bin").write_bytes(data)
    return path


def test_artifact_gc_is_admin_only_keeps_registered_versions_and_a_dry_run_changes_nothing(
    api: TestClient, plane: ControlPlane, tmp_path: Path
) -> None:
    store = plane.store
    store.ensure_team("nlp")
    store.create_user("mo")
    store.set_member("nlp", "mo", "team-admin")
    member = store.create_token("mo").token
    artifacts = ArtifactStore(
        open_blobs(plane.config.artifact_store_url),
        config=ArtifactConfig(avg_chunk=16 * 1024),
    )
    kept = artifacts.push(_random_dir(tmp_path / "kept", 300_000, 1)).manifest
    dropped = artifacts.push(_random_dir(tmp_path / "dropped", 200_000, 2)).manifest
    store.register_version(
        "nlp", "m", artifact=kept.digest, size_bytes=kept.total_bytes, created_by="mo"
    )

    refused = api.post("/api/v1/artifacts/gc", headers={"Authorization": f"Bearer {member}"})
    assert refused.status_code == 403
    assert "only platform admins may garbage-collect" in refused.json()["message"]

    dry = api.post("/api/v1/artifacts/gc", params={"dry_run": "true"}).json()
    assert dry["dry_run"] is True and dry["chunks_freed"] == 0
    assert dry["chunks_kept"] == len(kept.chunk_hashes())
    assert dry["chunks_condemned"] == len(dropped.chunk_hashes())
    assert api.post("/api/v1/artifacts/gc", params={"dry_run": "true"}).json() == dry

    first = api.post("/api/v1/artifacts/gc").json()  # condemns
    second = api.post("/api/v1/artifacts/gc").json()  # frees: the grace period is 0 here

    assert first["chunks_condemned"] == len(dropped.chunk_hashes())
    assert first["manifests_deleted"] == 1 and first["chunks_freed"] == 0
    assert second["chunks_freed"] == len(dropped.chunk_hashes())
    assert second["bytes_freed"] >= 200_000
    assert second["chunks_kept"] == len(kept.chunk_hashes()) and second["bytes_kept"] >= 300_000
    chunks = {p.name for p in (Path(plane.config.artifact_store_url) / "chunks").rglob("*")}
    assert {c for c in chunks if len(c) == 64} == kept.chunk_hashes()  # no orphans
    artifacts.verify(kept.digest)


def test_a_restarted_control_loop_finishes_removals_a_crash_interrupted(
    api: TestClient, plane: ControlPlane
) -> None:
    job = api.post("/api/v1/jobs", json={"spec": SPEC}).json()
    store = plane.store
    paths = []
    for step in (100, 200, 300):
        path = Path(job["run_dir"]) / "checkpoints" / f"step-{step:09d}"
        path.mkdir(parents=True)
        store.add_checkpoint(job["id"], 1, step=step, path=str(path), ts=time.time())
        paths.append(path)
    # the retention transaction committed, then the process died before any directory went
    retire = [Retirement(100, str(paths[0]), True), Retirement(200, str(paths[1]), True)]
    store.retire_checkpoints(job["id"], retire, message="retention: deleted step 100, 200")

    assert plane.controller.lead()  # a (re)started loop recovers first

    assert [p.exists() for p in paths] == [False, False, True]
    assert store.pending_checkpoint_removals() == []


def test_a_checkpoint_records_its_format_and_lists_the_metrics_of_its_step(
    api: TestClient, plane: ControlPlane, tmp_path: Path
) -> None:
    job = api.post("/api/v1/jobs", json={"spec": {**SPEC, "checkpoint": {"keep": 10}}}).json()
    plane.store.start_attempt(job["id"], handle={})
    auth = {"Authorization": f"Bearer {plane.store.issue_job_token(job['id'], attempt=1)}"}
    now = time.time()
    run = Path(job["run_dir"])  # a job reports paths inside its own files (docs/access.md)
    dcp = run / "dcp"  # a torch.distributed.checkpoint directory the server can see
    dcp.mkdir(parents=True)
    (dcp / ".metadata").write_bytes(b"m")
    (dcp / "__0_0.distcp").write_bytes(b"s")
    megatron = run / "iter_0000300"  # a Megatron distributed checkpoint
    megatron.mkdir()
    for name in ("metadata.json", "common.pt", "0.distcp.bin"):
        (megatron / name).write_bytes(b"x")
    body = {
        "attempt": 1,
        "metrics": [
            {"step": 100, "ts": now, "values": {"loss": 2.5, "eval_loss": 2.75}},
            {"step": 150, "ts": now, "values": {"loss": 2.0}},
        ],
        "checkpoints": [
            {"step": 100, "path": str(run / "s"), "ts": now, "format": "state-dict"},
            {"step": 200, "path": str(dcp), "ts": now},  # no format: detected
            {"step": 300, "path": str(megatron), "ts": now},
            {"step": 400, "path": str(run / "pod-local" / "step-400"), "ts": now},  # unseen
        ],
    }
    response = api.post(f"/api/v1/jobs/{job['id']}/report", json=body, headers=auth)
    assert response.status_code == 200, response.text

    listed = api.get(f"/api/v1/jobs/{job['id']}/checkpoints").json()
    assert [(c["step"], c["format"]) for c in listed] == [
        (100, "state-dict"),
        (200, "dcp"),
        (300, "megatron-dist"),
        (400, None),
    ]
    assert listed[0]["metrics"] == {"loss": 2.5, "eval_loss": 2.75}
    assert [c["metrics"] for c in listed[1:]] == [{}, {}, {}]  # no metrics at those steps
    events = [e["message"] for e in api.get(f"/api/v1/jobs/{job['id']}/events").json()]
    assert "checkpoint at step 200 (dcp)" in events

    bad = dict(body, checkpoints=[{"step": 500, "path": "/x", "ts": now, "format": "pickle"}])
    refused = api.post(f"/api/v1/jobs/{job['id']}/report", json=bad, headers=auth)
    assert refused.status_code == 422
    assert "format" in refused.text and "dcp" in refused.text  # the field and the choices
    assert len(api.get(f"/api/v1/jobs/{job['id']}/checkpoints").json()) == 4
