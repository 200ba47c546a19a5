"""The Slurm executor in slurmrestd mode (`rest_url`) against the test cluster's real
slurmrestd (JWT auth, OpenAPI v0.0.38): the executor's guarantees of sbatch mode (launch
idempotent by attempt key, pending reasons, exit codes, cancel, per-rank logs), the control
plane end to end (the tiny GPT on two nodes, cancel from tyard, a control plane SIGKILLed right
after the submission), and bad settings refused at start with the setting and the fix."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.base import AttemptPhase
from tensoryard.executors.slurm.cluster import SlurmCluster as ClusterView
from tensoryard.executors.slurm.commands import SlurmCommands
from tensoryard.executors.slurm.config import SlurmConfig, slurm_config_from
from tensoryard.executors.slurm.executor import SlurmExecutor
from tensoryard.executors.slurm.rest import SlurmRest
from tests.e2e.conftest import ServerProcess, free_port, tyard, wait_for
from tests.e2e_slurm.conftest import RENDEZVOUS_PORTS, SlurmCluster, free_loopback_port, wait_until
from tests.e2e_slurm.test_slurm_control_plane import (
    TERMINAL,
    explain,
    slurm_jobs_of,
    submitted,
    two_node_job,
)
from tests.e2e_slurm.test_slurm_executor import request, sleeper, wait_finished


def rest_config(slurm: SlurmCluster, **changes: Any) -> SlurmConfig:
    base: dict[str, Any] = {
        "slurm_conf": str(slurm.conf),
        "rendezvous_ports": list(RENDEZVOUS_PORTS),
        "command_timeout_s": 10,
        "queue_ttl_s": 0.2,
        **slurm.rest_settings(),
    }
    return slurm_config_from({**base, **changes})


def server_fails(tmp_path: Path, settings: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    out = tyard(
        "server", "--home", str(tmp_path / "home"), "--port", str(free_port()),
        "--executor", "slurm", "--slurm-config", str(settings), *args, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 30, "the server took too long to refuse"
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    return out


# -- the executor -----------------------------------------------------------------------------


def test_over_slurmrestd_launching_one_attempt_key_again_and_at_once_submits_one_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(rest_config(slurm))
    executor.cluster.check_config()
    assert executor.rest is not None and executor.rest.dialect.version == "v0.0.38"
    req = request(tmp_path, "rest-idem", sleeper(tmp_path, 2))
    handles: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: handles.append(executor.launch(req))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # another control plane, then the record written after the submission lost (a crash
    # between the two): the queue read through slurmrestd still knows the job
    handles.append(SlurmExecutor(rest_config(slurm)).launch(req))
    (Path(handles[0]["attempt_dir"]) / "slurm-job.json").unlink()
    handles.append(executor.launch(req))
    assert len({h["slurm_job_id"] for h in handles}) == 1
    [job] = slurm.jobs_named("tyard.rest-idem")
    assert job["comment"].startswith("tensoryard job=7 attempt=1 key=rest-idem")
    assert wait_finished(executor, handles[0]).phase is AttemptPhase.SUCCEEDED
    assert executor.log_paths(handles[0])[0].read_text().strip() == "up"  # the rank's log
    assert executor.launch(req) == handles[0]
    assert len(slurm.jobs_named("tyard.rest-idem")) == 1


def test_over_slurmrestd_a_waiting_job_shows_slurms_reason_and_cancel_removes_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(rest_config(slurm))
    script = sleeper(tmp_path, 60)
    fills = [
        executor.launch(request(tmp_path, f"rest-fill-{i}", script, cpu=4, memory="1Gi"))
        for i in (1, 2)
    ]
    waiting = executor.launch(request(tmp_path, "rest-wait", script, cpu=4, memory="1Gi"))
    status = wait_until(
        lambda: (s := executor.poll(waiting)).reason and "Slurm reason" in s.reason and s,
        30,
        "a pending reason",
    )
    assert status.phase is AttemptPhase.STARTING and status.queued
    assert status.reason.startswith("pending in Slurm: ")
    assert any(f"(Slurm reason: {w})" in status.reason for w in ("Resources", "Priority"))
    wait_until(
        lambda: all(executor.poll(h).phase is AttemptPhase.RUNNING for h in fills),
        60,
        "the two jobs that fill the nodes to run",
    )
    for handle in (waiting, *fills):
        executor.cancel(handle, grace_s=1)
    for handle in (waiting, *fills):
        assert wait_finished(executor, handle).phase is AttemptPhase.CANCELLED
    states = {j["name"]: j["job_state"] for j in slurm.jobs_named("tyard.rest-")}
    assert states["tyard.rest-wait"] == "CANCELLED"
    assert not [s for s in states.values() if s in ("PENDING", "RUNNING")], states


def test_over_slurmrestd_a_script_that_fails_at_once_is_a_failed_attempt_with_its_exit_code(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(rest_config(slurm))
    handle = executor.launch(request(tmp_path, "rest-bad", str(tmp_path / "missing.py")))
    status = wait_finished(executor, handle)
    assert status.phase is AttemptPhase.FAILED
    assert status.failed_ranks == (0,) and status.exit_code == 2
    assert "rank 0 exited with code 2" in status.reason
    assert "missing.py" in executor.log_paths(handle)[0].read_text()
    assert executor.terminate(handle) == 0


def test_over_slurmrestd_a_job_slurm_requeues_is_a_failed_attempt_and_never_runs_twice(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """v0.0.38 leaves requeue on whatever it is sent: a requeued job (here `scontrol
    requeue`, as after a node failure) is cancelled and reported, for the control plane to
    restart the attempt from its checkpoint; its script does not start again."""
    executor = SlurmExecutor(rest_config(slurm))
    handle = executor.launch(request(tmp_path, "rest-requeue", sleeper(tmp_path, 60)))
    wait_until(lambda: executor.poll(handle).phase is AttemptPhase.RUNNING, 60, "the job to run")
    slurm.run("scontrol", "requeue", str(handle["slurm_job_id"]))
    status = wait_finished(executor, handle, timeout=30)
    assert status.phase is AttemptPhase.FAILED
    assert f"Slurm job {handle['slurm_job_id']} was requeued by Slurm" in status.reason
    wait_until(
        lambda: [j["job_state"] for j in slurm.jobs_named("tyard.rest-requeue")] == ["CANCELLED"],
        30,
        "the requeued job to be cancelled",
    )
    assert executor.log_paths(handle)[0].read_text().split() == ["up"]  # ran once


# -- the control plane ------------------------------------------------------------------------


@pytest.fixture
def rest_plane(slurm: SlurmCluster, tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    config = slurm.config_file(
        tmp_path / "slurm.yaml", teams={"*": {"partition": "debug"}}, **slurm.rest_settings()
    )
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--executor", "slurm", "--slurm-config", str(config), "--cancel-grace", "60"],
    )
    yield server
    server.stop()


@pytest.mark.slow
def test_over_slurmrestd_the_tiny_gpt_trains_on_two_nodes_and_cancel_removes_the_next_job(
    slurm: SlurmCluster, rest_plane: ServerProcess, tmp_path: Path
) -> None:
    client = rest_plane.start()
    job_id = client.submit(two_node_job(tmp_path, "--steps", "10"))["id"]
    job = wait_for(client, job_id, TERMINAL, timeout=240)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    [sjob] = slurm_jobs_of(slurm, client, job_id)
    assert sjob["job_state"] == "COMPLETED" and sjob["nodes"] == "n[1-2]"
    assert sjob["partition"] == "debug"
    attempt_dir = Path(job["run_dir"]) / "attempt-1"
    for rank in (0, 1):  # one torchrun per node, each rank its own log and exit record
        record = json.loads((attempt_dir / f"rank-{rank}.exit.json").read_text())
        assert record["exit_code"] == 0 and record["node"] in ("n1", "n2")
        assert (attempt_dir / f"rank-{rank}.log").stat().st_size > 0
    assert sorted(m["step"] for m in client.metrics(job_id))[-1] == 10
    logs = tyard(
        "logs", str(job_id), "--rank", "1",
        env={"TYARD_SERVER": rest_plane.url, "TYARD_HOME": str(rest_plane.home)},
    )  # fmt: skip
    assert logs.returncode == 0 and "[rank 1]" in logs.stdout, logs.stderr

    # cancel from tyard: SIGTERM through slurmrestd, the workers checkpoint, the job ends
    long_id = client.submit(two_node_job(tmp_path, "--steps", "100000"))["id"]
    wait_for(client, long_id, {"RUNNING"}, timeout=180)
    wait_until(lambda: client.checkpoints(long_id), timeout=120, what="a first checkpoint")
    client.cancel(long_id)
    job = wait_for(client, long_id, TERMINAL, timeout=60)
    assert job["state"] == "CANCELLED"
    ended = wait_until(
        lambda: [j for j in slurm_jobs_of(slurm, client, long_id) if j["job_state"] == "CANCELLED"],
        timeout=30,
        what="the Slurm job to end as CANCELLED",
    )
    assert len(ended) == len(slurm_jobs_of(slurm, client, long_id)) == 1
    for rank in (0, 1):  # each rank was told to stop (SIGTERM) and ended cleanly
        path = Path(job["run_dir"]) / "attempt-1" / f"rank-{rank}.exit.json"
        record = json.loads(path.read_text())
        assert record["sigterm_at"] is not None and record["exit_code"] == 0, record
    assert (
        "on request (checkpoint written)"
        in (Path(job["run_dir"]) / "attempt-1" / "rank-0.log").read_text()
    )


def test_over_slurmrestd_a_control_plane_killed_right_after_the_submission_submits_once(
    slurm: SlurmCluster, rest_plane: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "once.py"
    script.write_text("import time; time.sleep(2); print('ran')\n")
    spec = {
        "name": "once",
        "launcher": "python",
        "command": [str(script)],
        "workdir": str(tmp_path),
        "resources": {"cpu": 1, "memory": "64Mi"},
        "restart": {"max_restarts": 0},
    }
    rest_plane.env = {"TYARD_CRASH_AT": "launch.after_start"}
    client = rest_plane.start()
    job_id = client.submit(spec)["id"]
    assert rest_plane.proc is not None
    assert rest_plane.proc.wait(60) == -9, "the control plane did not reach its crash point"
    rest_plane.env = {}
    client = rest_plane.start()
    job = wait_for(client, job_id, TERMINAL, timeout=120)
    assert job["state"] == "SUCCEEDED", explain(client, job_id, job["run_dir"])
    assert len(client.attempts(job_id)) == 1
    key = submitted(client, job_id)[1]["attempt_key"]
    assert len(slurm.jobs_named(f"tyard.{key}")) == 1  # one submission though launch ran twice
    assert (Path(job["run_dir"]) / "attempt-1" / "rank-0.log").read_text().strip() == "ran"


# -- bad input --------------------------------------------------------------------------------


def test_slurmrestd_unreachable_stops_the_server_naming_rest_url_not_a_hang(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    nowhere = f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens there
    config = rest_config(slurm, rest_url=nowhere, command_timeout_s=3)
    with pytest.raises(ConfigError, match=f"slurmrestd at {nowhere} \\(rest_url\\) is unreach"):
        ClusterView(SlurmCommands(config), config, rest=SlurmRest(config)).check_config()
    rest = {k: v for k, v in slurm.rest_settings().items() if k != "rest_url"}
    settings = slurm.config_file(tmp_path / "slurm.yaml", **rest)
    out = server_fails(tmp_path, settings, "--slurm-rest-url", nowhere)
    assert f"slurmrestd at {nowhere} (rest_url) is unreachable" in out.stderr, out.stderr
    assert "fix: start slurmrestd" in out.stderr


def test_a_token_slurmrestd_refuses_stops_the_server_naming_the_token_setting(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.token"
    bad.write_text("SLURM_JWT=eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJyb290In0.bm90LXNpZ25lZA\n")
    config = rest_config(slurm, rest_token_file=str(bad))
    with pytest.raises(ExecutorError, match="refuses an invalid or expired token this way"):
        SlurmExecutor(config).launch(request(tmp_path, "rest-token", "x.py"))
    settings = slurm.config_file(
        tmp_path / "slurm.yaml", **{**slurm.rest_settings(), "rest_token_file": str(bad)}
    )
    out = server_fails(tmp_path, settings)
    assert f"the token in rest_token_file {bad} for user root" in out.stderr, out.stderr
    assert "fix: put a fresh `scontrol token username=root" in out.stderr
    settings.write_text(settings.read_text().replace(str(bad), str(tmp_path / "none.token")))
    out = server_fails(tmp_path, settings)
    assert "cannot read the slurmrestd token: rest_token_file" in out.stderr, out.stderr


def test_pinning_nodes_over_v0_0_38_is_refused_at_start_naming_admission(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    settings = slurm.config_file(
        tmp_path / "slurm.yaml", **{**slurm.rest_settings(), "admission": "tensoryard"}
    )
    out = server_fails(tmp_path, settings)
    assert "admission: tensoryard pins each job's nodes, which slurmrestd v0.0.38" in out.stderr
    assert "fix: set admission: slurm" in out.stderr


@pytest.fixture
def old_slurmrestd(slurm: SlurmCluster, tmp_path: Path) -> Iterator[str]:
    """A second slurmrestd on the same cluster that serves only v0.0.37 (a version tensoryard
    does not speak), stopped by its PID."""
    slurm.rest_url  # noqa: B018 -- skips (or fails under CI) without slurmrestd
    conf, user = slurm.conf, []
    if os.geteuid() == 0:  # slurmrestd runs as nobody: the copy of slurm.conf it can read
        conf_dir = (slurm.dir / "run" / "slurmrestd.conf-dir").read_text().strip()
        conf, user = Path(conf_dir) / "slurm.conf", ["-u", "nobody"]
    port = free_loopback_port()
    binary = shutil.which("slurmrestd") or "/usr/sbin/slurmrestd"
    log = (tmp_path / "slurmrestd-old.out").open("wb")
    proc = subprocess.Popen(
        [binary, "-f", str(conf), "-a", "rest_auth/jwt", "-s", "openapi/v0.0.37", *user,
         f"127.0.0.1:{port}"],
        env={**os.environ, "SLURM_JWT": "daemon"},
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    log.close()
    try:

        def listening() -> bool:
            assert proc.poll() is None, (tmp_path / "slurmrestd-old.out").read_text()
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 15, "the v0.0.37 slurmrestd to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_slurmrestd_that_speaks_no_version_we_speak_is_refused_naming_the_fix(
    slurm: SlurmCluster, old_slurmrestd: str, tmp_path: Path
) -> None:
    config = rest_config(slurm, rest_url=old_slurmrestd)
    with pytest.raises(ConfigError) as caught:
        ClusterView(SlurmCommands(config), config, rest=SlurmRest(config)).check_config()
    words = str(caught.value)
    assert f"slurmrestd at {old_slurmrestd} (rest_url) speaks v0.0.37; tensoryard speaks" in words
    assert "v0.0.38" in words and "fix: load one of them in slurmrestd" in words
    pinned = rest_config(slurm, rest_api_version="0.0.41")
    with pytest.raises(
        ExecutorError, match=r"rest_api_version v0\.0\.41: slurmrestd at .* does not"
    ):
        SlurmRest(pinned).ping()
