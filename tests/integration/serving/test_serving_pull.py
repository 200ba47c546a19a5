"""`python -m tensoryard.serving.pull`: the init container of GPU serving pods, run here as the
real process against a real (directory) artifact store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tensoryard.registry import ArtifactStore, open_blobs


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "hf-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    return model


def _run(*args: str, env_store: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if env_store is not None:
        env["TYARD_ARTIFACT_STORE"] = env_store
    return subprocess.run(
        [sys.executable, "-m", "tensoryard.serving.pull", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_a_version_is_pulled_verified_reported_and_not_pulled_twice(tmp_path: Path) -> None:
    store_url = str(tmp_path / "artifacts")
    pushed = ArtifactStore(open_blobs(store_url)).push(_model_dir(tmp_path))
    digest = pushed.manifest.digest
    dest = tmp_path / "models" / digest
    dest.parent.mkdir()
    log = tmp_path / "termination-log"
    done = _run(digest, str(dest), "--termination-log", str(log), env_store=store_url)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["digest"] == digest and report["files"] == 2 and not report["cached"]
    assert report["bytes"] == 256 * 4096 + len((dest / "config.json").read_bytes())
    assert json.loads(log.read_text()) == report  # what the pod status carries back
    assert (dest / "model.safetensors").read_bytes() == bytes(range(256)) * 4096
    assert [p.name for p in dest.parent.iterdir()] == [digest]  # no temporary left
    again = _run(digest, str(dest), "--termination-log", str(log), env_store=store_url)
    assert json.loads(again.stdout)["cached"] is True
    assert json.loads(again.stdout)["pull_s"] == 0.0


def test_an_unknown_digest_or_no_store_is_a_one_line_error_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    store_url = str(tmp_path / "artifacts")
    ArtifactStore(open_blobs(store_url)).push(_model_dir(tmp_path))
    log = tmp_path / "termination-log"
    dest = tmp_path / "models" / "nope"
    dest.parent.mkdir()
    done = _run("0" * 64, str(dest), "--termination-log", str(log), env_store=store_url)
    assert done.returncode == 1
    assert "cannot pull" in done.stderr and "Traceback" not in done.stderr
    assert "cannot pull" in json.loads(log.read_text())["error"]
    assert list(dest.parent.iterdir()) == []
    missing = _run("0" * 64, str(dest))
    assert missing.returncode == 2 and "TYARD_ARTIFACT_STORE" in missing.stderr
