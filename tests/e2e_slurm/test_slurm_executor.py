"""The Slurm executor on its own against the real test cluster: launch idempotent by attempt
key, pending reasons, cancel, a script that fails at once, and bad settings refused with a
clear error (no hang) before anything is submitted."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus, LaunchRequest
from tensoryard.executors.slurm.cluster import SlurmCluster as ClusterView
from tensoryard.executors.slurm.commands import SlurmCommands
from tensoryard.executors.slurm.config import SlurmConfig, TeamMapping
from tensoryard.executors.slurm.executor import SlurmExecutor
from tensoryard.spec.job import JobSpec
from tests.e2e.conftest import tyard
from tests.e2e_slurm.conftest import RENDEZVOUS_PORTS, SlurmCluster, wait_until


def config_for(slurm: SlurmCluster, **changes: Any) -> SlurmConfig:
    base: dict[str, Any] = {
        "slurm_conf": slurm.conf,
        "rendezvous_ports": RENDEZVOUS_PORTS,
        "command_timeout_s": 10.0,
        "queue_ttl_s": 0.2,
    }
    return SlurmConfig(**{**base, **changes})


def request(tmp_path: Path, key: str, *command: str, **resources: Any) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "launcher": "python",
            "command": list(command),
            "workdir": str(tmp_path),
            "resources": {"cpu": 1, "memory": "64Mi", **resources},
        }
    )
    return LaunchRequest(job_id="7", attempt=1, spec=spec, run_dir=tmp_path / key, attempt_key=key)


def sleeper(tmp_path: Path, seconds: float) -> str:
    script = tmp_path / "sleep.py"
    script.write_text(f"import time; print('up', flush=True); time.sleep({seconds})\n")
    return str(script)


def wait_finished(
    executor: SlurmExecutor, handle: dict[str, Any], timeout: float = 60
) -> AttemptStatus:
    def done() -> AttemptStatus | None:
        status = executor.poll(handle)
        return status if status.finished else None

    return wait_until(done, timeout, "the attempt to finish")  # type: ignore[no-any-return]


def test_launching_one_attempt_key_again_and_at_once_submits_one_slurm_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(config_for(slurm))
    req = request(tmp_path, "idem-1", sleeper(tmp_path, 3))
    handles: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: handles.append(executor.launch(req))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a second executor (another control plane) launching it again finds the same job
    handles.append(SlurmExecutor(config_for(slurm)).launch(req))
    # the record written after sbatch lost (a crash between the two): the queue still knows
    (Path(handles[0]["attempt_dir"]) / "slurm-job.json").unlink()
    handles.append(executor.launch(req))
    assert len({h["slurm_job_id"] for h in handles}) == 1
    assert len(slurm.jobs_named("tyard.idem-1")) == 1
    assert wait_finished(executor, handles[0]).phase is AttemptPhase.SUCCEEDED
    assert executor.launch(req) == handles[0]  # finished: still nothing new
    assert len(slurm.jobs_named("tyard.idem-1")) == 1


def test_a_job_waiting_for_resources_shows_slurms_reason_and_cancel_removes_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(config_for(slurm))
    script = sleeper(tmp_path, 60)
    big = executor.launch(request(tmp_path, "fill", script, cpu=4, memory="1Gi"))
    wait_until(lambda: executor.poll(big).phase is AttemptPhase.RUNNING, 60, "the first job to run")
    # n2 is still free: fill it too, then one more job must wait
    other = executor.launch(request(tmp_path, "fill-2", script, cpu=4, memory="1Gi"))
    waiting = executor.launch(request(tmp_path, "wait", script, cpu=4, memory="1Gi"))
    status = wait_until(
        lambda: (s := executor.poll(waiting)).reason and "Slurm reason" in s.reason and s,
        30,
        "a pending reason",
    )
    assert status.phase is AttemptPhase.STARTING and status.queued
    assert status.reason.startswith("pending in Slurm: ")
    assert (
        "(Slurm reason: Resources)" in status.reason or "(Slurm reason: Priority)" in status.reason
    )
    for handle in (waiting, big, other):
        executor.cancel(handle, grace_s=1)
    for handle in (waiting, big, other):
        assert wait_finished(executor, handle).phase is AttemptPhase.CANCELLED
    alive = [j for j in slurm.jobs_named("tyard.") if j["job_state"] in ("PENDING", "RUNNING")]
    assert not alive


def test_a_script_that_fails_at_once_is_a_failed_attempt_with_its_error(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = SlurmExecutor(config_for(slurm))
    handle = executor.launch(request(tmp_path, "bad-script", str(tmp_path / "missing.py")))
    status = wait_finished(executor, handle)
    assert status.phase is AttemptPhase.FAILED
    assert status.failed_ranks == (0,) and status.exit_code == 2
    assert "rank 0 exited with code 2" in status.reason
    assert "missing.py" in executor.log_paths(handle)[0].read_text()


def test_terminate_cancels_every_slurm_job_of_the_key(slurm: SlurmCluster, tmp_path: Path) -> None:
    executor = SlurmExecutor(config_for(slurm))
    handle = executor.launch(request(tmp_path, "term", sleeper(tmp_path, 60)))
    assert executor.terminate(handle) == 1
    wait_until(
        lambda: all(j["job_state"] == "CANCELLED" for j in slurm.jobs_named("tyard.term")),
        30,
        "scancel",
    )
    assert executor.terminate(handle) == 0


def test_slurmctld_down_is_a_clear_error_naming_the_setting_not_a_hang(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    conf = tmp_path / "slurm.conf"
    text = slurm.conf.read_text()
    port = next(line for line in text.splitlines() if line.startswith("SlurmctldPort="))
    conf.write_text(text.replace(port, "SlurmctldPort=27199"))  # nothing listens there
    (tmp_path / "gres.conf").write_text((slurm.dir / "gres.conf").read_text())
    config = config_for(slurm, slurm_conf=conf, command_timeout_s=3.0)
    started = time.monotonic()
    with pytest.raises(ExecutorError, match=f"slurmctld is down or unreachable.*SLURM_CONF={conf}"):
        SlurmExecutor(config).launch(request(tmp_path, "down", "x.py"))
    assert time.monotonic() - started < 10
    with pytest.raises(
        ConfigError, match=r"--executor slurm: scontrol.*slurmctld is down or unreachable"
    ):
        ClusterView(SlurmCommands(config), config).check_config()
    settings = tmp_path / "slurm.yaml"
    settings.write_text(f"slurm_conf: {conf}\ncommand_timeout_s: 3\n")
    out = tyard(
        "server", "--home", str(tmp_path / "home"), "--port", "27198",
        "--executor", "slurm", "--slurm-config", str(settings),
        timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert f"slurmctld is down or unreachable (SLURM_CONF={conf}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("mapping", "words"),
    [
        (TeamMapping(partition="nope"), "teams.nlp.partition 'nope' does not exist"),
        (TeamMapping(partition="debug", qos="high"), "keeps no accounting"),
        (TeamMapping(account="physics"), "keeps no accounting"),
    ],
    ids=["an unknown partition", "a QOS without accounting", "an account without accounting"],
)
def test_a_team_mapping_slurm_cannot_honour_stops_the_server_from_starting(
    slurm: SlurmCluster, tmp_path: Path, mapping: TeamMapping, words: str
) -> None:
    config = config_for(slurm, teams={"nlp": mapping})
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        ClusterView(SlurmCommands(config), config).check_config()


def test_tyard_server_refuses_an_unknown_partition_with_exit_and_message(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    path = slurm.config_file(tmp_path / "slurm.yaml", teams={"nlp": {"partition": "gpu-h100"}})
    out = tyard(
        "server", "--home", str(tmp_path / "home"), "--port", "27197",
        "--executor", "slurm", "--slurm-config", str(path), timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "teams.nlp.partition 'gpu-h100' does not exist (partitions: debug, long)" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_settings_file_with_a_mistyped_key_is_bad_input_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "slurm.yaml"
    path.write_text("teams:\n  nlp: {partiton: gpu}\n")
    out = tyard(
        "server", "--home", str(tmp_path / "home"), "--executor", "slurm",
        "--slurm-config", str(path), timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "teams.nlp must be a mapping with keys partition, qos, account" in out.stderr
