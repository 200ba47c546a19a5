"""Parsing `sacct --json` and sacct's "exit:signal" text, on output recorded from a real Slurm
22.05.8 cluster with slurmdbd and MariaDB (scripts/slurm-testenv up --accounting):
samples/sacct-22.05.8.json holds jobs that completed (rec-ok), exited 3 (rec-fail), were
killed by SIGKILL (rec-signal), were cancelled (rec-cancel), hit their time limit
(rec-timeout), were requeued once and then completed (rec-requeue), ran under account nlp and
QOS high (rec-acct), had a step that exited 5 (rec-step), one that is not tensoryard's and one
still running; samples/sacct-exitcodes-22.05.8.txt is `sacct -X -n -P -D -o
JobIDRaw,ExitCode` for the same jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.slurm.accounting import (
    AccountedJob,
    accounting_configured,
    exit_pair_status,
    parse_exit_pairs,
    parse_sacct,
)
from tensoryard.executors.slurm.config import slurm_config_from

SAMPLES = Path(__file__).with_name("samples")


@pytest.fixture
def recorded() -> dict[str, Any]:
    return dict(json.loads((SAMPLES / "sacct-22.05.8.json").read_text()))


@pytest.fixture
def by_name(recorded: dict[str, Any]) -> dict[str, AccountedJob]:
    pairs = parse_exit_pairs((SAMPLES / "sacct-exitcodes-22.05.8.txt").read_text())
    out = {}
    for job in parse_sacct(recorded).values():
        if job.exit_suspect and job.job_id in pairs:
            job = job.with_exit_status(pairs[job.job_id])
        out[job.name.removeprefix("tyard.")] = job
    return out


def test_the_recorded_json_misreports_exit_codes_which_the_text_form_corrects(
    recorded: dict[str, Any],
) -> None:
    # the trap itself: 22.05's JSON says SUCCESS/0 for a job that exited 3
    raw = next(j for j in recorded["jobs"] if j["name"] == "tyard.rec-fail")
    assert raw["state"]["current"] == "FAILED"
    assert raw["exit_code"] == {"status": "SUCCESS", "return_code": 0}
    parsed = parse_sacct(recorded)[raw["job_id"]]
    assert parsed.exit_suspect and parsed.exit_code == 0
    pairs = parse_exit_pairs((SAMPLES / "sacct-exitcodes-22.05.8.txt").read_text())
    assert parsed.with_exit_status(pairs[raw["job_id"]]).exit_code == 3


def test_states_exit_codes_and_elapsed_time_of_ended_jobs(
    by_name: dict[str, AccountedJob],
) -> None:
    assert (by_name["rec-ok"].state, by_name["rec-ok"].exit_code) == ("COMPLETED", 0)
    assert not by_name["rec-ok"].exit_suspect
    assert (by_name["rec-fail"].state, by_name["rec-fail"].exit_code) == ("FAILED", 3)
    assert by_name["rec-fail"].exit_pair == "3:0"
    # the signal is right in the JSON itself: no correction needed
    signal = by_name["rec-signal"]
    assert (signal.state, signal.exit_code, signal.exit_pair) == ("FAILED", -9, "0:9")
    assert not signal.exit_suspect
    assert by_name["rec-step"].exit_code == 5
    assert by_name["rec-cancel"].state == "CANCELLED" and by_name["rec-cancel"].elapsed_s == 2
    assert by_name["rec-timeout"].state == "TIMEOUT" and by_name["rec-timeout"].elapsed_s == 80
    assert all(j.ended for n, j in by_name.items() if n != "rec-running")
    assert not by_name["rec-running"].ended


def test_a_requeued_job_is_one_record_of_its_last_run_with_the_runs_before_counted(
    recorded: dict[str, Any], by_name: dict[str, AccountedJob]
) -> None:
    runs = [j for j in recorded["jobs"] if j["name"] == "tyard.rec-requeue"]
    assert [r["state"]["current"] for r in runs] == ["REQUEUED", "COMPLETED"]
    job = by_name["rec-requeue"]
    assert (job.state, job.requeues, job.elapsed_s) == ("COMPLETED", 1, 4)
    assert "requeued 1 time," in job.facts()
    assert by_name["rec-ok"].requeues == 0 and "requeued" not in by_name["rec-ok"].facts()


def test_account_and_qos_are_kept_and_shown(by_name: dict[str, AccountedJob]) -> None:
    job = by_name["rec-acct"]
    assert (job.account, job.qos, job.partition) == ("nlp", "high", "debug")
    assert job.facts() == (
        f"Slurm accounting: job {job.job_id} COMPLETED, exit 0:0 (exited with code 0), "
        "elapsed 0 s, account nlp, QOS high"
    )
    assert "killed by SIGKILL" in by_name["rec-signal"].facts()


@pytest.mark.parametrize(
    ("pair", "status", "code"),
    [("0:0", 0, 0), ("3:0", 768, 3), ("0:9", 9, -9), ("0:15", 15, -15), ("255:0", 65280, 255)],
)
def test_exit_signal_pairs_become_wait_statuses(pair: str, status: int, code: int) -> None:
    accounted = AccountedJob(
        job_id=1, name="x", state="FAILED", reason="None", exit_status=exit_pair_status(pair),
        exit_suspect=False, elapsed_s=0, requeues=0, start_time=None, end_time=None,
        nodes="", account="", qos="", partition="",
    )  # fmt: skip
    assert accounted.exit_status == status and accounted.exit_code == code
    assert accounted.exit_pair == pair


@pytest.mark.parametrize("bad", ["", "3", "x:0", "3:x", "300:0", "0:200"])
def test_a_malformed_exit_pair_is_an_executor_error(bad: str) -> None:
    with pytest.raises(ExecutorError, match="exit:signal"):
        exit_pair_status(bad)


def test_errors_and_unknown_shapes_are_clear_executor_errors() -> None:
    with pytest.raises(ExecutorError, match="sacct reported: Invalid job id"):
        parse_sacct({"errors": [{"error": "Invalid job id"}], "jobs": []})
    with pytest.raises(ExecutorError, match="without a list of jobs"):
        parse_sacct({"meta": {}})
    with pytest.raises(ExecutorError, match="unknown shape"):
        parse_sacct({"jobs": [{"name": "no id"}]})
    assert parse_sacct({"jobs": [], "errors": []}) == {}


def test_newer_shapes_of_state_and_exit_code_are_read() -> None:
    # v0.0.40+: state.current is a list, numbers may be {"set", "number"}
    data = {
        "jobs": [
            {
                "job_id": 5,
                "name": "tyard.k",
                "state": {"current": ["FAILED"], "reason": "NonZeroExitCode"},
                "exit_code": {
                    "status": ["EXITED"],
                    "return_code": {"set": True, "number": 2},
                    "signal": {"id": {"set": False, "number": 0}, "name": ""},
                },
                "time": {"elapsed": 7, "start": 100, "end": 107},
            }
        ]
    }
    job = parse_sacct(data)[5]
    assert (job.state, job.exit_code, job.elapsed_s, job.exit_suspect) == ("FAILED", 2, 7, False)


@pytest.mark.parametrize(
    ("value", "configured"),
    [
        ("accounting_storage/slurmdbd", True),
        ("accounting_storage/none", False),
        ("", False),
        ("(null)", False),
    ],
)
def test_accounting_is_detected_from_accounting_storage_type(value: str, configured: bool) -> None:
    assert accounting_configured(value) is configured


def test_the_accounting_setting() -> None:
    assert slurm_config_from({}).accounting == "auto"
    assert slurm_config_from({"accounting": "sacct"}).accounting == "sacct"
    assert slurm_config_from({"accounting": False}).accounting == "off"  # YAML's bare off
    with pytest.raises(ConfigError, match="accounting 'yes': use 'auto'"):
        slurm_config_from({"accounting": "yes"})
