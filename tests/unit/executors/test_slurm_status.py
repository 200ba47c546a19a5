"""Parsing `squeue --json` and translating Slurm's states and pending reasons, on JSON recorded
from a real Slurm 22.05.8 cluster (scripts/slurm-testenv; samples/squeue-22.05.8.json holds
completed, failed, cancelled, running, pending (Resources, Priority, JobHeldUser) jobs and one
job that is not tensoryard's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ConfigError, ExecutorError
from tensoryard.executors.slurm.cluster import gpu_count, gpu_model
from tensoryard.executors.slurm.commands import _pairs
from tensoryard.executors.slurm.config import TeamMapping, slurm_config_from
from tensoryard.executors.slurm.status import (
    decode_wait_status,
    describe_exit,
    jobs_by_key,
    parse_jobs,
    pending_reason,
)

SAMPLE = Path(__file__).with_name("samples") / "squeue-22.05.8.json"


@pytest.fixture
def recorded() -> dict[str, Any]:
    return dict(json.loads(SAMPLE.read_text()))


def test_jobs_are_found_by_the_attempt_key_in_their_name_and_others_are_left_out(
    recorded: dict[str, Any],
) -> None:
    by_key = jobs_by_key(parse_jobs(recorded))
    assert "other-user-job" not in {j.name for jobs in by_key.values() for j in jobs}
    assert {"rec-ok", "rec-fail", "rec-cancel", "rec-run", "rec-resources"} <= set(by_key)
    assert by_key["rec-run"][0].state == "RUNNING" and by_key["rec-run"][0].nodes == "n[1-2]"
    assert by_key["rec-run"][0].alive and not by_key["rec-run"][0].pending


def test_exit_code_is_a_raw_wait_status_and_is_decoded(recorded: dict[str, Any]) -> None:
    by_key = jobs_by_key(parse_jobs(recorded))
    failed = by_key["rec-fail"][0]
    assert failed.state == "FAILED" and failed.exit_code == 768  # exit 3, as Slurm stores it
    assert decode_wait_status(768) == 3
    assert decode_wait_status(0) == 0
    assert decode_wait_status(9) == -9  # killed by SIGKILL
    assert decode_wait_status(15 | 0x80) == -15  # core-dump flag ignored
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert not by_key["rec-ok"][0].alive and by_key["rec-ok"][0].exit_code == 0


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("rec-resources", "the nodes or GPUs it asks for are in use (Slurm reason: Resources)"),
        ("rec-priority", "jobs of higher priority are ahead of it"),
        ("rec-hold", "held by its user (scontrol release) (Slurm reason: JobHeldUser)"),
    ],
    ids=["Resources", "Priority", "JobHeldUser"],
)
def test_pending_reasons_are_translated_and_keep_slurms_word(
    recorded: dict[str, Any], key: str, words: str
) -> None:
    [job] = jobs_by_key(parse_jobs(recorded))[key]
    assert job.pending
    assert pending_reason(job).startswith("pending in Slurm: ")
    assert words in pending_reason(job)


def test_an_unknown_pending_reason_is_shown_in_slurms_words(recorded: dict[str, Any]) -> None:
    raw = dict(recorded)
    raw["jobs"] = [{**recorded["jobs"][0], "job_state": "PENDING", "state_reason": "NewThing"}]
    [job] = parse_jobs(raw)
    assert pending_reason(job) == "pending in Slurm (Slurm reason: NewThing)"


def test_newer_openapi_shapes_are_read_too() -> None:
    """v0.0.40+: job_state is a list of flags, numbers are {set, number}, exit_code is split."""
    raw = {
        "errors": [],
        "jobs": [
            {
                "job_id": {"set": True, "number": 42},
                "name": "tyard.k",
                "job_state": ["FAILED"],
                "state_reason": "NonZeroExitCode",
                "exit_code": {"status": ["EXIT"], "return_code": {"set": True, "number": 3}},
                "start_time": {"set": True, "number": 10},
            }
        ],
    }
    [job] = parse_jobs(raw)
    assert (job.job_id, job.state, job.start_time) == (42, "FAILED", 10.0)
    assert job.exit_code is not None and decode_wait_status(job.exit_code) == 3


def test_errors_reported_by_squeue_are_raised() -> None:
    with pytest.raises(ExecutorError, match="squeue reported: Unable to contact slurm"):
        parse_jobs({"errors": [{"error": "Unable to contact slurm controller"}], "jobs": []})
    with pytest.raises(ExecutorError, match="without a list of jobs"):
        parse_jobs({"meta": {}})


def test_scontrol_records_and_gres_strings() -> None:
    rec = _pairs("NodeName=n1 CPUTot=4 Gres=gpu:h100:8(S:0-1) OS=Linux 6.1 #1 SMP RealMemory=4000")
    assert rec["OS"] == "Linux 6.1 #1 SMP" and rec["RealMemory"] == "4000"
    assert gpu_count(rec["Gres"]) == 8
    assert gpu_count("gpu:a100:2,gpu:h100:2") == 4
    assert gpu_count("gpu:4") == 4
    assert gpu_count("(null)") == 0
    assert gpu_model("gpu:h100:8(S:0-1)") == "h100" and gpu_model("gpu:4") == "gpu"


def test_config_file_settings_are_checked_and_name_the_setting() -> None:
    config = slurm_config_from(
        {"teams": {"nlp": {"partition": "long", "qos": "high"}, "*": {"partition": "debug"}}}
    )
    assert config.team("nlp") == TeamMapping(partition="long", qos="high")
    assert config.team("vision") == TeamMapping(partition="debug")
    with pytest.raises(ConfigError, match=r"unknown setting.*partitoin"):
        slurm_config_from({"partitoin": "x"})
    with pytest.raises(ConfigError, match=r"teams\.nlp must be a mapping"):
        slurm_config_from({"teams": {"nlp": {"partiton": "x"}}})
    with pytest.raises(ConfigError, match="admission 'kueue'"):
        slurm_config_from({"admission": "kueue"})
    with pytest.raises(ConfigError, match="rendezvous_ports"):
        slurm_config_from({"rendezvous_ports": [5, 1]})


def test_the_rank_that_ended_first_is_named_as_the_cause(tmp_path: Path) -> None:
    """Rank 1 killed by SIGKILL ends first; rank 0 then exits 1 when its peer's connection
    drops. The reason names rank 1 although rank 0 is the lower number; a rank stopped by
    SIGTERM after the failure is not a failed one."""
    from tensoryard.executors.local.layout import AttemptLayout
    from tensoryard.executors.slurm.executor import _failed_ranks

    layout = AttemptLayout(tmp_path)
    records = {
        0: {"exit_code": 1, "ended_at": 1000.75, "sigterm_at": None},
        1: {"exit_code": -9, "ended_at": 1000.25, "sigterm_at": None},
        2: {"exit_code": -15, "ended_at": 1000.5, "sigterm_at": 1000.4},
        3: {"exit_code": 0, "ended_at": 1001.0, "sigterm_at": None},
    }
    for rank, record in records.items():
        layout.rank_exit(rank).write_text(json.dumps(record), encoding="utf-8")
    assert _failed_ranks(layout, 4) == (1, 0)
