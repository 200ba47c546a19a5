"""A real short torch training run under the real control plane (uvicorn on loopback, the
control loop, the local executor, SQLite): the job's `keep_best` policy keeps the checkpoint
with the best eval_loss while later ones are pruned, and `tyard describe` and `tyard models gc`
show it through the CLI."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from tensoryard.cli.main import app as cli
from tensoryard.server.config import ServerConfig
from tensoryard.server.main import ControlPlane, build_control_plane

pytestmark = pytest.mark.slow

TRAIN = Path(__file__).resolve().parents[1] / "runtime" / "_retention_train.py"
STEPS, SWITCH, INTERVAL = 40, 20, 5


@dataclass
class Live:
    url: str
    plane: ControlPlane


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    port = _free_port()
    config = ServerConfig(home=tmp_path / "home", port=port, cpu_slots=2)
    plane = build_control_plane(config)
    server = uvicorn.Server(uvicorn.Config(plane.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    plane.controller.start()
    yield Live(f"http://127.0.0.1:{port}", plane)
    plane.controller.stop()
    server.should_exit = True
    thread.join(timeout=10)
    plane.store.close()


def tyard(live: Live, *args: str) -> tuple[int, Any]:
    env = {"TYARD_SERVER": live.url, "TYARD_TOKEN": live.plane.admin_token}
    result = CliRunner().invoke(cli, list(args), env=env)
    text = result.stdout.strip()
    if result.exit_code == 0 and "--json" in args:
        return 0, json.loads(text)
    return result.exit_code, text + result.stderr


def test_keep_best_keeps_the_best_eval_checkpoint_while_later_ones_are_pruned(
    live: Live, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"""
name: retention
launcher: python
command: ["{TRAIN}", "--steps", "{STEPS}", "--switch", "{SWITCH}", "--step-sleep", "0.1"]
env: {{OMP_NUM_THREADS: "1"}}
checkpoint:
  interval: {INTERVAL}
  keep: 1
  keep_best: {{metric: eval_loss, mode: min, count: 1}}
"""
    )
    code, job = tyard(live, "submit", str(spec), "--json")
    assert code == 0, job
    store = live.plane.store
    deadline = time.monotonic() + 180
    while store.get_job(job["id"]).state not in ("SUCCEEDED", "FAILED"):
        assert time.monotonic() < deadline, store.list_events(job["id"])
        time.sleep(0.2)
    assert store.get_job(job["id"]).state == "SUCCEEDED", store.list_events(job["id"])

    evals = {
        m.step: m.values["eval_loss"]
        for m in store.list_metrics(job["id"])
        if "eval_loss" in m.values
    }
    assert sorted(evals) == list(range(INTERVAL, STEPS + 1, INTERVAL))
    best = min(evals, key=lambda s: evals[s])
    assert best == SWITCH  # the eval loss fell until the switch and rose after it
    kept = [c.step for c in store.list_checkpoints(job["id"])]
    assert kept == [SWITCH, STEPS]
    ckpt_dir = Path(store.get_job(job["id"]).run_dir) / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [
        f"step-{SWITCH:09d}",
        f"step-{STEPS:09d}",
    ]
    removed = [r.step for r in store.checkpoint_removals(job["id"])]
    assert removed == [s for s in range(INTERVAL, STEPS, INTERVAL) if s != SWITCH]
    events = [e.message for e in store.list_events(job["id"]) if e.kind == "retention"]
    assert len(events) >= 2, events  # pruned as the run went, report by report
    assert any(f"kept {SWITCH} (best 1 by eval_loss)" in e for e in events), events

    code, text = tyard(live, "describe", str(job["id"]))
    assert code == 0, text
    assert f"checkpoints: {SWITCH}, {STEPS} (latest {STEPS}: state-dict, " in text
    assert "; retention (keep last 1, best 1 by eval_loss" in text
    assert f"deleted step {', '.join(str(s) for s in removed)}" in text
    code, described = tyard(live, "describe", str(job["id"]), "--json")
    assert [r["step"] for r in described["checkpoints_removed"]] == removed
    # each kept checkpoint: its format (the runtime's full layout) and the metrics at its step
    by_step = {c["step"]: c for c in described["checkpoints"]}
    assert {c["format"] for c in by_step.values()} == {"state-dict"}
    assert by_step[SWITCH]["metrics"]["eval_loss"] == pytest.approx(evals[SWITCH])

    code, gc = tyard(live, "models", "gc", "--dry-run", "--json")
    assert code == 0 and gc["dry_run"] is True and gc["chunks_freed"] == 0
    code, text = tyard(live, "models", "gc")
    assert code == 0 and "kept 0 chunks" in text and "freed 0 chunks" in text
