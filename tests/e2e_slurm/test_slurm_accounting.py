"""The Slurm executor on a cluster that keeps accounting (slurmdbd with a private MariaDB,
started by scripts/slurm-testenv up --accounting): jobs that have left squeue get their end
from `sacct --json` (state, exit code, elapsed time, requeues), and the per-team account and
QOS mapping is checked against the real accounts before anything is submitted."""

from __future__ import annotations

import json
import os
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tensoryard.client import Client
from tensoryard.errors import ConfigError
from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.executors.slurm.cluster import SlurmCluster as ClusterView
from tensoryard.executors.slurm.commands import SlurmCommands
from tensoryard.executors.slurm.config import TeamMapping
from tensoryard.executors.slurm.executor import SlurmExecutor, SlurmHandle
from tests.e2e.conftest import ServerProcess, free_port, tyard, wait_for
from tests.e2e_slurm.conftest import SlurmCluster, wait_until
from tests.e2e_slurm.test_slurm_executor import config_for, request, sleeper, wait_finished


def sacct_line(slurm: SlurmCluster, job_id: int) -> dict[str, str]:
    """sacct's own words for the job's last run (its text form, not the JSON the executor
    reads)."""
    out = slurm.run(
        "sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,ExitCode,Account,QOS"
    )
    state, exit_pair, account, qos = out.strip().splitlines()[-1].split("|")
    return {"state": state.split()[0], "exit": exit_pair, "account": account, "qos": qos}


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_jobs_that_left_squeue_end_as_slurmdbd_recorded_them(
    slurm_accounting: SlurmCluster, tmp_path: Path
) -> None:
    slurm = slurm_accounting
    mapping = TeamMapping(account="nlp", qos="high")
    executor = SlurmExecutor(config_for(slurm, teams={"*": mapping}))
    assert executor.accounting()  # detected: AccountingStorageType=accounting_storage/slurmdbd
    ok = executor.launch(request(tmp_path, "acct-ok", script(tmp_path, "ok.py", "print(1)\n")))
    fail = executor.launch(
        request(tmp_path, "acct-fail", script(tmp_path, "f.py", "import sys; sys.exit(3)\n"))
    )
    cancel = executor.launch(request(tmp_path, "acct-cancel", sleeper(tmp_path, 120)))
    # cancelled outside tensoryard, and its batch script's record lost afterwards (as when
    # the attempt directory is not on storage the control plane reads): without accounting
    # its end could only be guessed
    killed = executor.launch(request(tmp_path, "acct-killed", sleeper(tmp_path, 120)))
    handles = {"ok": ok, "fail": fail, "cancel": cancel, "killed": killed}

    def runs(handle: dict[str, Any]) -> bool:
        return executor.poll(handle).phase is AttemptPhase.RUNNING

    for running in (cancel, killed):
        wait_until(partial(runs, running), 90, "it to run")
    executor.cancel(cancel, grace_s=1)
    slurm.run("scancel", str(killed["slurm_job_id"]))
    for handle in handles.values():
        wait_finished(executor, handle, timeout=90)
    # MinJobAge=2 and slurmctld's purge (once a minute): then only slurmdbd knows them
    (Path(killed["attempt_dir"]) / "slurm-exit.json").unlink()
    wait_until(lambda: not slurm.jobs_named("tyard.acct-"), 150, "the jobs to leave squeue")

    fresh = SlurmExecutor(config_for(slurm, teams={"*": mapping}))  # a restarted control plane
    ended: dict[str, AttemptStatus] = {n: fresh.poll(h) for n, h in handles.items()}
    truth = {n: sacct_line(slurm, h["slurm_job_id"]) for n, h in handles.items()}
    assert [truth[n]["state"] for n in handles] == ["COMPLETED", "FAILED", "CANCELLED", "CANCELLED"]
    assert truth["fail"]["exit"] == "3:0"
    for name, status in ended.items():
        job_id = handles[name]["slurm_job_id"]
        assert f"Slurm accounting: job {job_id} {truth[name]['state']}, " in status.reason
        assert f"exit {truth[name]['exit']}" in status.reason, status.reason
        assert "account nlp, QOS high" in status.reason
        assert (truth[name]["account"], truth[name]["qos"]) == ("nlp", "high")
    assert ended["ok"].phase is AttemptPhase.SUCCEEDED and ended["ok"].exit_code == 0
    assert ended["fail"].phase is AttemptPhase.FAILED and ended["fail"].exit_code == 3
    assert ended["fail"].failed_ranks == (0,)
    assert ended["cancel"].phase is AttemptPhase.CANCELLED
    assert ended["killed"].phase is AttemptPhase.FAILED
    assert "was cancelled in Slurm" in ended["killed"].reason
    # the same attempt without accounting: only its absence is known
    blind = SlurmExecutor(config_for(slurm, accounting="off")).poll(killed)
    assert blind.phase is AttemptPhase.LOST and "no longer in Slurm's queue" in blind.reason


def test_a_job_slurm_requeued_keeps_its_runs_in_accounting(
    slurm_accounting: SlurmCluster, tmp_path: Path
) -> None:
    """Slurm's own requeue (here an administrator's `scontrol requeue`, after allowing it:
    tensoryard submits with --no-requeue) inside one attempt: the executor cancels the
    requeued job and the control plane starts the next attempt itself; slurmdbd keeps both
    runs, and the attempt's end says so."""
    slurm = slurm_accounting
    executor = SlurmExecutor(config_for(slurm))
    handle = executor.launch(request(tmp_path, "acct-requeue", sleeper(tmp_path, 120)))
    wait_until(lambda: executor.poll(handle).phase is AttemptPhase.RUNNING, 90, "it to run")
    job_id = int(handle["slurm_job_id"])
    slurm.run("scontrol", "update", f"jobid={job_id}", "requeue=1")
    slurm.run("scontrol", "requeue", str(job_id))
    status = wait_finished(executor, handle, timeout=60)
    assert status.phase is AttemptPhase.FAILED and "was requeued by Slurm" in status.reason
    wait_until(lambda: not slurm.jobs_named("tyard.acct-requeue"), 150, "it to leave squeue")
    accounted = SlurmExecutor(config_for(slurm)).accounted(SlurmHandle.from_dict(handle))
    assert accounted is not None
    assert (accounted.state, accounted.requeues) == ("CANCELLED", 1)
    runs = slurm.run("sacct", "-X", "-n", "-P", "-D", "-j", str(job_id), "-o", "State")
    assert [r.split()[0] for r in runs.splitlines()] == ["REQUEUED", "CANCELLED"]


@pytest.mark.parametrize(
    ("mapping", "words"),
    [
        (TeamMapping(account="physics"), "teams.nlp.account 'physics' does not exist in Slurm's "
         "accounting (known: nlp, root, vision)"),
        (TeamMapping(qos="urgent"), "teams.nlp.qos 'urgent' does not exist in Slurm's "
         "accounting (known: high, normal)"),
    ],
    ids=["an unknown account", "an unknown QOS"],
)  # fmt: skip
def test_an_account_or_qos_that_slurmdbd_does_not_know_stops_the_server(
    slurm_accounting: SlurmCluster, mapping: TeamMapping, words: str
) -> None:
    config = config_for(slurm_accounting, teams={"nlp": mapping, "vision": TeamMapping()})
    with pytest.raises(ConfigError) as caught:
        ClusterView(SlurmCommands(config), config).check_config()
    assert words in str(caught.value)
    good = config_for(
        slurm_accounting, teams={"nlp": TeamMapping(partition="debug", account="nlp", qos="high")}
    )
    ClusterView(SlurmCommands(good), good).check_config()  # real accounts: accepted


def test_the_testenv_stops_slurmdbd_and_mariadb_by_their_pids(
    slurm_accounting: SlurmCluster,
) -> None:
    for name in ("slurmdbd", "mariadb"):
        pid = int((slurm_accounting.dir / "run" / f"{name}.pid").read_text())
        os.kill(pid, 0)  # alive while the cluster is up
    conf = slurm_accounting.dir / "slurmdbd.conf"
    assert conf.stat().st_mode & 0o777 == 0o600
    assert "StorageType=accounting_storage/mysql" in conf.read_text()
    done = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
        env=slurm_accounting.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.split() == ["tyardtest"]


def test_tyard_server_refuses_an_unknown_account_with_exit_and_message(
    slurm_accounting: SlurmCluster, tmp_path: Path
) -> None:
    path = slurm_accounting.config_file(
        tmp_path / "slurm.yaml", teams={"nlp": {"account": "physics"}}
    )
    out = tyard(
        "server", "--home", str(tmp_path / "home"), "--port", "47299",
        "--executor", "slurm", "--slurm-config", str(path), timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert (
        "teams.nlp.account 'physics' does not exist in Slurm's accounting "
        "(known: nlp, root, vision)" in out.stderr
    ), out.stderr
    assert "Traceback" not in out.stderr


def test_tyard_describe_shows_what_slurm_accounted_for_each_attempt(
    slurm_accounting: SlurmCluster, tmp_path: Path
) -> None:
    """Through the control plane: a job that exits 3 once and then succeeds; `tyard describe`
    lists both attempts with sacct's state, exit code and elapsed time beside tensoryard's."""
    home = tmp_path / "home"
    home.mkdir()
    teams = {"*": {"partition": "debug", "account": "vision", "qos": "high"}}
    config = slurm_accounting.config_file(tmp_path / "slurm.yaml", teams=teams)
    server = ServerProcess(
        home=home,
        port=free_port(),
        extra_args=["--executor", "slurm", "--slurm-config", str(config)],
    )
    marker = tmp_path / "failed-once"
    body = (
        "import pathlib, sys\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n"
        "    m.write_text('x'); sys.exit(3)\n"
        "print('second time lucky')\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "acct-describe",
                "launcher": "python",
                "command": [script(tmp_path, "once.py", body)],
                "workdir": str(tmp_path),
                "resources": {"cpu": 1, "memory": "64Mi"},
                "restart": {"max_restarts": 1, "backoff": 0},
            }
        )
    )
    try:
        client = server.start()
        env = {"TYARD_SERVER": server.url, "TYARD_HOME": str(home)}
        out = tyard("submit", str(spec), "--json", env=env)
        assert out.returncode == 0, out.stderr
        job_id = int(json.loads(out.stdout.strip().splitlines()[-1])["id"])
        job = wait_for(client, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
        assert job["state"] == "SUCCEEDED", job["reason"]
        described = tyard("describe", str(job_id), "--json", env=env)
        assert described.returncode == 0, described.stderr
        first, second = json.loads(described.stdout)["attempts_detail"]
        ids = [int(r["slurm_job_id"]) for r in submitted_records(client, job_id)]
        # sacct's own record of an end may show the QOS as "Unknown" for a moment, as the
        # JSON does (slurmdbd fills it in after the end): read it once it is complete
        deadline = time.monotonic() + 30
        while True:
            truth = [sacct_line(slurm_accounting, i) for i in ids]
            if all(t["qos"] != "Unknown" for t in truth) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [t["state"] for t in truth] == ["FAILED", "COMPLETED"]
        assert first["state"] == "failed" and first["exit_code"] == 3
        assert f"Slurm accounting: job {ids[0]} FAILED, exit 3:0" in first["reason"]
        assert f"Slurm accounting: job {ids[1]} COMPLETED, exit 0:0" in second["reason"]
        # slurmdbd's first record of an end may lack the QOS for a moment (seen on 22.05.8)
        assert "account vision" in second["reason"] and "QOS normal" not in second["reason"]
        assert truth[1]["qos"] == "high"
        human = tyard("describe", str(job_id), env={**env, "COLUMNS": "250"})
        assert "Slurm accounting: job" in human.stdout.replace("\n", " ")
    finally:
        server.stop()


def submitted_records(client: Client, job_id: int) -> list[dict[str, Any]]:
    run_dir = Path(client.job(job_id)["run_dir"])
    return [
        json.loads((run_dir / f"attempt-{a['number']}" / "slurm-job.json").read_text())
        for a in sorted(client.attempts(job_id), key=lambda a: int(a["number"]))
    ]
