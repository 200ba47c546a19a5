"""The model registry on SQLite and PostgreSQL, with a real artifact store and torch checkpoints."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tensoryard.errors import NotFound, SpecError
from tensoryard.registry import ArtifactConfig, ArtifactStore, open_blobs
from tensoryard.registry.retention import RetentionPolicy
from tensoryard.registry.service import ModelRegistry
from tensoryard.spec.job import JobSpec
from tensoryard.store import JobRecord, Store

DATA_HASH = "b3:" + "ab" * 32


def _job(store: Store, runs: Path, team: str = "nlp") -> JobRecord:
    store.ensure_team(team)
    spec = JobSpec.model_validate(
        {
            "name": "pretrain",
            "team": team,
            "command": ["train.py"],
            "env": {"TYARD_CODE_REVISION": "abc1234", "TYARD_DATA_MANIFEST": DATA_HASH},
        }
    )
    return store.create_job(spec, run_dir_root=runs)


def _checkpoint(store: Store, job: JobRecord, root: Path, step: int, loss: float) -> Path:
    torch.manual_seed(step)
    path = Path(job.run_dir) / root.name / f"step-{step:09d}"  # inside the job's own files
    path.mkdir(parents=True)
    state = {"model": {"w": torch.randn(64, 64), "b": torch.zeros(64)}, "step": step}
    torch.save(state, path / "state.pt")
    store.add_checkpoint(job.id, 1, step=step, path=str(path), ts=time.time())
    store.add_metrics(job.id, 1, [{"step": step, "ts": time.time(), "values": {"loss": loss}}])
    return path


@pytest.fixture
def registry(store: Store, tmp_path: Path) -> ModelRegistry:
    artifacts = ArtifactStore(
        open_blobs(str(tmp_path / "artifacts")), config=ArtifactConfig(avg_chunk=4096)
    )
    return ModelRegistry(store, artifacts)


def test_a_checkpoint_promoted_to_a_version_carries_its_lineage_both_ways(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path / "runs")
    _checkpoint(store, job, tmp_path / "ckpt", 50, 2.5)
    _checkpoint(store, job, tmp_path / "ckpt", 100, 1.25)

    v1 = registry.register_checkpoint("nlp", "tiny-gpt", job.id, created_by="ana", step=50)
    v2 = registry.register_checkpoint(
        "nlp", "tiny-gpt", job.id, created_by="ana", parent="1", tags={"stage": "pretrain"}
    )

    assert (v1.version, v2.version) == (1, 2)
    assert v2.checkpoint_step == 100 and v2.metrics == {"loss": 1.25}
    assert v2.format == "state-dict" and v2.source == "checkpoint"
    assert (v2.job_id, v2.code_revision, v2.data_manifest) == (job.id, "abc1234", DATA_HASH)
    assert v2.spec is not None and v2.spec["name"] == "pretrain"
    assert v2.parent == "tiny-gpt:1" and v2.tags == {"stage": "pretrain"}
    # "which models used this dataset" / "what did this job make"
    assert [v.ref for v in store.find_versions(data_manifest=DATA_HASH)] == [
        "nlp/tiny-gpt:1",
        "nlp/tiny-gpt:2",
    ]
    assert [v.version for v in store.find_versions(job_id=job.id, tag=("stage", "pretrain"))] == [2]
    # "how was this model made" / "what was made from it"
    assert [a.version for a in store.lineage("nlp", "tiny-gpt", 2).ancestors] == [1]
    assert [c.version for c in store.lineage("nlp", "tiny-gpt", 1).children] == [2]
    registry.artifacts.pull(v2.artifact, tmp_path / "out")
    state = torch.load(tmp_path / "out" / "state.pt", weights_only=True)
    assert state["step"] == 100


def test_aliases_move_atomically_and_resolve(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path / "runs")
    _checkpoint(store, job, tmp_path / "c", 10, 3.0)
    for _ in range(2):
        registry.register_checkpoint("nlp", "m", job.id, created_by="ana")

    store.set_alias("nlp", "m", "production", 1)
    moved = store.set_alias("nlp", "m", "production", 2)

    assert moved.aliases == ("production",)
    assert store.get_version("nlp", "m", "production").version == 2
    assert store.get_model("nlp", "m").aliases == {"production": 2}
    assert store.get_version("nlp", "m", 1).aliases == ()


def test_an_alias_on_a_missing_version_is_refused_and_changes_nothing(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path / "runs")
    _checkpoint(store, job, tmp_path / "c", 10, 3.0)
    registry.register_checkpoint("nlp", "m", job.id, created_by="ana", aliases=["production"])

    with pytest.raises(NotFound, match=r"nlp/m has no version 7 \(its versions are 1..1"):
        store.set_alias("nlp", "m", "production", 7)
    with pytest.raises(NotFound, match="has no alias 'staging'"):
        store.get_version("nlp", "m", "staging")

    assert store.get_model("nlp", "m").aliases == {"production": 1}


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"tags": {"Bad Key": "x"}}, SpecError, "tags.Bad Key"),
        ({"aliases": ["UPPER"]}, SpecError, r"aliases\[0\]"),
        ({"parent": "other:3"}, NotFound, "model nlp/other does not exist"),
        ({"job_id": 999}, NotFound, "job 999 does not exist"),
        ({"format": "pickle"}, SpecError, "unknown format"),
    ],
    ids=["a bad tag key", "a bad alias", "a missing parent", "a missing job", "a bad format"],
)
def test_bad_registrations_leave_nothing_half_registered(
    registry: ModelRegistry,
    store: Store,
    tmp_path: Path,
    fields: dict[str, object],
    error: type[Exception],
    match: str,
) -> None:
    store.ensure_team("nlp")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "w.bin").write_bytes(b"x" * 10_000)
    artifact = registry.artifacts.push(tmp_path / "files").manifest.digest

    with pytest.raises(error, match=match):
        registry.register_artifact("nlp", "fresh", artifact, created_by="ana", **fields)

    assert store.list_models() == []  # not even the model row


def test_registering_an_artifact_that_was_never_pushed_names_the_store(
    registry: ModelRegistry, store: Store
) -> None:
    store.ensure_team("nlp")
    with pytest.raises(NotFound, match="is not in the artifact store"):
        registry.register_artifact("nlp", "m", "0" * 64, created_by="ana")


def test_registry_gc_keeps_registered_artifacts_and_drops_the_rest(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp")
    for name, fill in (("kept", b"k"), ("dropped", b"d")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w.bin").write_bytes(fill * 50_000 + name.encode() * 1000)
    kept = registry.artifacts.push(tmp_path / "kept").manifest.digest
    registry.artifacts.push(tmp_path / "dropped")
    registry.register_artifact("nlp", "m", kept, created_by="ana")
    registry.artifacts.config.gc_grace_s = -1  # all "old": condemn, then delete

    registry.gc()
    registry.gc()

    left = {b.key.rsplit("/", 1)[-1] for b in registry.artifacts.blobs.list("chunks/")}
    assert left == registry.artifacts.manifest(kept).chunk_hashes()


def test_retention_deletes_unkept_checkpoints_rows_and_directories_but_not_registered_ones(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    job = _job(store, tmp_path / "runs")
    losses = {10: 3.0, 20: 1.0, 30: 2.0, 40: 2.5, 50: 2.6}
    paths = {s: _checkpoint(store, job, tmp_path / "ckpt", s, loss) for s, loss in losses.items()}
    registry.register_checkpoint("nlp", "m", job.id, created_by="ana", step=10)

    dry = registry.apply_retention(
        job.id, RetentionPolicy(keep_best=1, metric="loss"), dry_run=True
    )
    assert [c.step for c in dry.delete] == [30, 40] and paths[30].exists()
    plan = registry.apply_retention(job.id, RetentionPolicy(keep_best=1, metric="loss"))

    assert [c.step for c in plan.keep] == [10, 20, 50]  # registered, best, newest
    assert [c.step for c in store.list_checkpoints(job.id)] == [10, 20, 50]
    assert [s for s, p in paths.items() if p.exists()] == [10, 20, 50]


def test_concurrent_registrations_get_distinct_consecutive_versions(
    registry: ModelRegistry, store: Store, tmp_path: Path
) -> None:
    store.ensure_team("nlp")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"a" * 10_000)
    digest = registry.artifacts.push(tmp_path / "w").manifest.digest
    registry.register_artifact("nlp", "m", digest, created_by="ana")

    with ThreadPoolExecutor(6) as pool:
        versions = list(
            pool.map(
                lambda i: (
                    registry.register_artifact(
                        "nlp", "m", digest, created_by=f"user{i}", aliases=["latest"]
                    ).version
                ),
                range(6),
            )
        )

    assert sorted(versions) == [2, 3, 4, 5, 6, 7]
    assert store.get_model("nlp", "m").aliases["latest"] in versions
