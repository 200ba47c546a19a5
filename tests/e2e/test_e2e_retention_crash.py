"""Fault injection for checkpoint retention: the control plane is SIGKILLed right after the
transaction that retires a checkpoint's row (crash point ``retention.after_rows``), before its
directory is deleted. The restarted control plane deletes it, the job's later reports apply the
policy again, and the job ends with exactly the checkpoints its policy keeps on disk."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, free_port, wait_for
from tests.e2e.test_e2e_crash_safety import wait_killed

pytestmark = pytest.mark.slow

# A job that writes a step-N directory and reports it, like the runtime's Checkpointer and
# Reporter, with time between checkpoints for the control plane to crash and come back.
JOB_SCRIPT = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    from tensoryard.runtime.report import Reporter

    root = Path(os.environ["TYARD_CHECKPOINT_DIR"])
    assert os.environ["TYARD_CHECKPOINT_KEEP"] == "0"  # retention is the control plane's
    reporter = Reporter.from_env()
    for step in (1, 2, 3, 4):
        path = root / f"step-{step:09d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.pt").write_bytes(b"w" * 1000)
        reporter.report(step, loss=1.0 / step)
        reporter.checkpoint(step, path, 1000)
        assert reporter.flush(timeout_s=60)
        time.sleep(1.0)
    reporter.close()
    """
)


def test_a_crash_between_retired_rows_and_deleted_directories_is_finished_after_restart(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "job.py").write_text(JOB_SCRIPT)
    plane = ServerProcess(home=home, port=free_port(), extra_args=["--cpu-slots", "2"])
    plane.env = {"TYARD_CRASH_AT": "retention.after_rows"}
    client = plane.start()
    try:
        spec = {
            "name": "keep-one",
            "launcher": "python",
            "command": ["job.py"],
            "workdir": str(tmp_path),
            "resources": {"cpu": 1, "memory": "64Mi"},
            "checkpoint": {"keep": 1},
        }
        job_id = client.submit(spec)["id"]
        wait_killed(plane)  # at the report of step 2: step 1's row is retired, its dir is not
        plane.env = {}
        client = plane.start()
        job = wait_for(client, job_id, {"SUCCEEDED", "FAILED"}, timeout=120)
        events = [e["message"] for e in client.events(job_id)]
        assert job["state"] == "SUCCEEDED", (job["reason"], events)

        ckpt_dir = Path(job["run_dir"]) / "checkpoints"
        assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-000000004"], events
        assert [c["step"] for c in client.checkpoints(job_id)] == [4]
        removed = client.checkpoint_removals(job_id)
        assert [r["step"] for r in removed] == [1, 2, 3]
        assert all(r["removed_at"] is not None for r in removed)
        assert any(m.startswith("retention: deleted step 1 ") for m in events), events
    finally:
        plane.stop()
