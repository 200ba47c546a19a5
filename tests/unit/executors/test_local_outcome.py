"""Exit records -> attempt status: the rules that name failed ranks, without processes."""

from __future__ import annotations

import pytest

from tensoryard.executors.base import AttemptPhase
from tensoryard.executors.local.outcome import (
    ExitRecord,
    RankExit,
    attempt_status,
    describe_exit,
    parse_torchrun_failures,
)

T0 = 1_000.0


def record(
    exit_code: int | None, ranks: dict[int, RankExit] | None = None, **kw: object
) -> ExitRecord:
    return ExitRecord(
        launcher=str(kw.pop("launcher", "torchrun")),
        exit_code=exit_code,
        started_at=T0,
        ended_at=T0 + 10,
        ranks=ranks or {},
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (-9, "was killed by SIGKILL (exit -9)"),
        (-15, "was killed by SIGTERM (exit -15)"),
        (137, "exited with code 137 (128+9: killed by SIGKILL)"),
        (255, "exited with code 255"),
    ],
    ids=[
        "success is a plain exit code",
        "an error exit is a plain exit code",
        "a negative code names the signal",
        "sigterm is named too",
        "a shell's 128+N code is spelled out as the signal",
        "a code beyond the signal range stays a plain code",
    ],
)
def test_exit_codes_are_described_for_humans(code: int, text: str) -> None:
    assert describe_exit(code) == text


CASES = [
    (
        record(0, {0: RankExit(0, T0 + 5), 1: RankExit(0, T0 + 5)}),
        AttemptPhase.SUCCEEDED,
        0,
        (),
        "all ranks exited with code 0",
    ),
    (
        record(1, {0: RankExit(-15, T0 + 6, sigterm_at=T0 + 5.5), 1: RankExit(-9, T0 + 5)}),
        AttemptPhase.FAILED,
        -9,
        (1,),
        "rank 1 was killed by SIGKILL (exit -9); rank 0 stopped after that",
    ),
    (
        record(1, {0: RankExit(0, T0 + 6), 1: RankExit(3, T0 + 5)}),
        AttemptPhase.FAILED,
        3,
        (1,),
        "rank 1 exited with code 3",
    ),
    (
        record(1, {0: RankExit(2, T0 + 5.2), 1: RankExit(3, T0 + 5.1)}),
        AttemptPhase.FAILED,
        3,
        (1, 0),
        "rank 1 exited with code 3; rank 0 exited with code 2",
    ),
    (
        record(
            1,
            {0: RankExit(-15, T0 + 6, sigterm_at=T0 + 5.5)},
            torchrun_failures={1: -9},
            torchrun_root=1,
        ),
        AttemptPhase.FAILED,
        -9,
        (1,),
        "rank 1 was killed by SIGKILL (exit -9); rank 0 stopped after that",
    ),
    (
        record(1, {0: RankExit(-15, T0 + 6, T0 + 5), 1: RankExit(-15, T0 + 6, T0 + 5)}),
        AttemptPhase.FAILED,
        -15,
        (0, 1),
        "rank 0 was killed by SIGTERM (exit -15); rank 1 was killed by SIGTERM (exit -15)",
    ),
    (
        record(-9, {0: RankExit(-15, T0 + 6, T0 + 5), 1: RankExit(-15, T0 + 6, T0 + 5)}),
        AttemptPhase.FAILED,
        -9,
        (),
        "torchrun was killed by SIGKILL (exit -9); its ranks were stopped",
    ),
    (
        record(1, {}),
        AttemptPhase.FAILED,
        1,
        (),
        "torchrun exited with code 1 before any rank failed (see launcher.log)",
    ),
    (
        record(3, {0: RankExit(3, T0 + 1)}, launcher="python"),
        AttemptPhase.FAILED,
        3,
        (0,),
        "rank 0 exited with code 3",
    ),
    (
        record(-15, {0: RankExit(-15, T0 + 1, T0 + 0.5)}, launcher="python", cancelled=True),
        AttemptPhase.CANCELLED,
        -15,
        (),
        "cancelled on request",
    ),
    (
        record(-9, {}, cancelled=True, escalated=True),
        AttemptPhase.CANCELLED,
        -9,
        (),
        "cancelled on request (forced with SIGKILL after the grace period)",
    ),
    (
        record(None, {}, error="cannot start 'python' in /nope: No such file or directory"),
        AttemptPhase.FAILED,
        None,
        (),
        "cannot start 'python' in /nope: No such file or directory",
    ),
    (
        record(1, {1: RankExit(1, T0 + 5, error="ValueError: bad batch")}),
        AttemptPhase.FAILED,
        1,
        (1,),
        "rank 1 exited with code 1; rank 1: ValueError: bad batch",
    ),
]


@pytest.mark.parametrize(
    ("rec", "phase", "exit_code", "failed", "reason"),
    CASES,
    ids=[
        "all ranks exiting zero is success",
        "a rank killed by sigkill is named and the rank torchrun stopped is not blamed",
        "a rank exiting with an error code is named",
        "two ranks failing on their own are both named, earliest first",
        "a rank whose wrapper was killed is taken from torchrun's report",
        "when every rank was told to stop the cause is outside and all are named",
        "torchrun killed by a signal is the cause, not the ranks it left behind",
        "torchrun failing before any rank ran points at the launcher log",
        "a python job's only process is rank 0",
        "a cancel wins over the exit code it caused",
        "a cancel that needed sigkill says so",
        "a workload that could not start fails with the start error",
        "a rank's error file message is part of the reason",
    ],
)
def test_exit_records_map_to_attempt_status(
    rec: ExitRecord,
    phase: AttemptPhase,
    exit_code: int | None,
    failed: tuple[int, ...],
    reason: str,
) -> None:
    status = attempt_status(rec)
    assert status.phase == phase
    assert status.exit_code == exit_code
    assert status.failed_ranks == failed
    assert status.reason == reason
    assert status.finished


def test_an_exit_record_survives_a_json_round_trip() -> None:
    rec = record(
        1,
        {0: RankExit(-15, T0 + 6, sigterm_at=T0 + 5.5), 1: RankExit(-9, T0 + 5, error="boom")},
        torchrun_failures={1: -9, 0: -15},
        torchrun_root=1,
        stragglers_killed=2,
    )
    data = rec.to_dict()
    assert data["signal"] is None and data["ranks"]["1"]["exit_code"] == -9
    assert ExitRecord.from_dict(data) == rec


TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
w.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_09:20:47
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10175)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 10175
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_09:20:47
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 10176)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 10176
============================================================
"""


def test_torchrun_failure_report_is_parsed_with_its_root_cause() -> None:
    failures, root = parse_torchrun_failures("noise before\n" + TORCHRUN_REPORT)
    assert failures == {0: -15, 1: -9}
    assert root == 1


def test_output_without_a_torchrun_report_yields_no_failures() -> None:
    assert parse_torchrun_failures("RuntimeError: rendezvous timed out\n") == ({}, None)
