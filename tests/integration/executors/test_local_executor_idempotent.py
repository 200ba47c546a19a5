"""Idempotent launch by attempt key, and kill by key (the executor half of crash safety)."""

from __future__ import annotations

import os
import shutil
import stat
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase, LaunchRequest
from tensoryard.executors.local import LocalExecutor
from tensoryard.executors.local.layout import AttemptLayout
from tensoryard.executors.local.procs import kill_all, marked_processes
from tensoryard.spec.job import parse_job_spec

SCRIPT = """
import os, sys, time
with open(os.environ["LEDGER"], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(float(sys.argv[1]))
"""


@pytest.fixture
def request_for(tmp_path: Path) -> Iterator[object]:
    (tmp_path / "job.py").write_text(textwrap.dedent(SCRIPT))
    keys: list[str] = []

    def make(key: str, seconds: float = 0.5, attempt: int = 1) -> LaunchRequest:
        spec = parse_job_spec(
            {
                "name": "idem",
                "launcher": "python",
                "command": ["job.py", str(seconds)],
                "workdir": str(tmp_path),
                "env": {"LEDGER": str(tmp_path / "ledger")},
            }
        )
        keys.append(key)
        return LaunchRequest(
            job_id="1", attempt=attempt, spec=spec, run_dir=tmp_path / "run", attempt_key=key
        )

    yield make
    for key in keys:
        kill_all(marked_processes(key))


def runs(tmp_path: Path) -> int:
    ledger = tmp_path / "ledger"
    return len(ledger.read_text().split()) if ledger.exists() else 0


def test_launching_the_same_attempt_key_twice_runs_the_workload_once(
    request_for: object, tmp_path: Path
) -> None:
    executor = LocalExecutor()
    req = request_for("k-twice", 1.0)  # type: ignore[operator]
    first = executor.launch(req)
    second = executor.launch(req)
    assert second["attempt_key"] == first["attempt_key"]
    assert second["shim_pid"] == first["shim_pid"]
    status = executor.wait(second, timeout_s=60)
    assert status.phase is AttemptPhase.SUCCEEDED
    third = executor.launch(req)  # after it ended: found again, not re-run
    assert executor.poll(third).phase is AttemptPhase.SUCCEEDED
    assert runs(tmp_path) == 1


def test_a_prepared_handle_finds_the_attempt_without_a_pid(
    request_for: object, tmp_path: Path
) -> None:
    executor = LocalExecutor()
    req = request_for("k-prepared", 0.3)  # type: ignore[operator]
    prepared = executor.prepare(req)
    assert prepared["shim_pid"] == 0
    executor.launch(req)
    assert executor.wait(prepared, timeout_s=60).phase is AttemptPhase.SUCCEEDED
    assert runs(tmp_path) == 1


class _Died(BaseException):
    """Stands in for the control plane dying (SIGKILL) at that line."""


def test_an_attempt_whose_supervisor_never_came_up_is_started_on_the_next_launch(
    request_for: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = LocalExecutor()
    req = request_for("k-half", 0.2)  # type: ignore[operator]

    def die(*_: object) -> None:
        raise _Died

    # The control plane dies after writing launch.json, before the shim starts.
    with monkeypatch.context() as m:
        m.setattr(LocalExecutor, "_start_shim", die)
        with pytest.raises(_Died):
            executor.launch(req)
    assert AttemptLayout.for_attempt(tmp_path / "run", 1).launch.exists()
    assert runs(tmp_path) == 0
    handle = executor.launch(req)
    assert executor.wait(handle, timeout_s=60).phase is AttemptPhase.SUCCEEDED
    assert runs(tmp_path) == 1


def test_a_directory_holding_another_attempt_key_is_refused(request_for: object) -> None:
    executor = LocalExecutor()
    handle = executor.launch(request_for("k-one", 0.2))  # type: ignore[operator]
    executor.wait(handle, timeout_s=60)
    with pytest.raises(ExecutorError, match="already holds attempt 'k-one'"):
        executor.launch(request_for("k-other", 0.2))  # type: ignore[operator]


def test_terminate_kills_every_process_of_the_attempt_by_its_key(request_for: object) -> None:
    executor = LocalExecutor()
    handle = executor.launch(request_for("k-kill", 60))  # type: ignore[operator]
    deadline = 50
    while not marked_processes("k-kill") and deadline:
        deadline -= 1
        os.sched_yield()
    assert executor.terminate(handle) >= 1
    assert not marked_processes("k-kill")


def test_attempt_files_are_private_and_jobs_get_no_control_plane_secrets(
    request_for: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TYARD_TOKEN", "admin-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-secret")
    executor = LocalExecutor()
    script = tmp_path / "env.py"
    script.write_text("import os, json; print(json.dumps(sorted(os.environ)))\n")
    spec = parse_job_spec(
        {"name": "env", "launcher": "python", "command": ["env.py"], "workdir": str(tmp_path)}
    )
    req = LaunchRequest(job_id="2", attempt=1, spec=spec, run_dir=tmp_path / "run2")
    handle = executor.launch(req)
    executor.wait(handle, timeout_s=60)
    log = executor.log_paths(handle)[0]
    names = log.read_text()
    assert "TYARD_TOKEN" not in names and "AWS_SECRET_ACCESS_KEY" not in names
    assert "PATH" in names and "TYARD_JOB_ID" in names
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root control plane chooses the job's user")
def test_a_root_control_plane_runs_the_job_as_the_submitters_unix_account() -> None:
    import pwd
    import tempfile

    try:
        account = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' account to run as")
    work = Path(tempfile.mkdtemp(prefix="tyard-runas-"))
    os.chmod(work, 0o755)  # the account must reach its workdir
    (work / "who.py").write_text("import os; print(os.getuid(), os.getgid(), os.environ['USER'])\n")
    os.chmod(work / "who.py", 0o644)
    spec = parse_job_spec(
        {
            "name": "whoami",
            "user": "nobody",
            "launcher": "python",
            "command": ["who.py"],
            "workdir": str(work),
        }
    )
    system_python = "/usr/bin/python3"  # the venv's interpreter lies under /root (0700)
    if not os.access(system_python, os.X_OK):
        pytest.skip("no system python3 that another account may run")
    executor = LocalExecutor(python=system_python)
    req = LaunchRequest(job_id="3", attempt=1, spec=spec, run_dir=work / "run")
    try:
        handle = executor.launch(req)
        assert executor.wait(handle, timeout_s=60).phase is AttemptPhase.SUCCEEDED
        log = executor.log_paths(handle)[0]
        assert log.read_text().split() == [str(account.pw_uid), str(account.pw_gid), "nobody"]
        assert log.stat().st_uid == account.pw_uid
        assert (work / "run").stat().st_uid == account.pw_uid
    finally:
        shutil.rmtree(work, ignore_errors=True)
