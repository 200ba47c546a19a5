"""An ended attempt's ending (its pods' logs kept through the API, a failed gang's other pods
stopped, the outcome recorded) runs off the control loop when the executor reports changes:
a poll answers what it answered before until the outcome is on record, then names the job
to the loop. Without the watches a poll ends the attempt itself, as before."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tensoryard.errors import ExecutorError
from tensoryard.executors.base import AttemptPhase, AttemptStatus
from tensoryard.executors.kubernetes import executor as executor_module
from tensoryard.executors.kubernetes.config import KubernetesConfig
from tensoryard.executors.kubernetes.executor import KubernetesExecutor, KubernetesHandle


class _Kube:
    def __init__(self) -> None:
        self.config = KubernetesConfig(namespace="ml")


class _Ending:
    """The parts of the executor an ending goes through, scripted."""

    def __init__(self, executor: KubernetesExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
        self.status = AttemptStatus(AttemptPhase.RUNNING)
        self.gate = threading.Event()
        self.gate.set()
        self.kept: list[str] = []
        self.stop_fails = False
        monkeypatch.setattr(executor, "_observe", lambda h: ({"kind": "JobSet"}, [{}, {}]))
        monkeypatch.setattr(executor_module, "attempt_status", lambda *a, **k: self.status)
        monkeypatch.setattr(executor, "_keep_logs", self._keep_logs)
        monkeypatch.setattr(executor, "_stop_rest_of_gang", self._stop)

    def _keep_logs(self, h: KubernetesHandle, pods: list[Any]) -> None:
        assert self.gate.wait(10)
        self.kept.append(h.attempt_key)

    def _stop(self, h: KubernetesHandle) -> None:
        if self.stop_fails:
            raise ExecutorError("deletecollection pods: 503 (the API server is busy)")


def _handle(tmp_path: Path) -> dict[str, Any]:
    return KubernetesHandle("7", 1, "ty-7-1", "ml", "ty-7-1", "JobSet", 2, str(tmp_path)).to_dict()


def _executor(tmp_path: Path) -> KubernetesExecutor:
    return KubernetesExecutor(_Kube(), kind="JobSet")  # type: ignore[arg-type]


def _watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[KubernetesExecutor, list[int | None], _Ending, dict[str, Any]]:
    """An executor that reports changes (into the list), its scripted ending, and a handle
    whose first poll said RUNNING."""
    executor = _executor(tmp_path)
    told: list[int | None] = []
    executor.report_changes(told.append)
    ending = _Ending(executor, monkeypatch)
    handle = _handle(tmp_path)
    assert executor.poll(handle).phase is AttemptPhase.RUNNING
    return executor, told, ending, handle


def test_with_the_watches_an_ending_does_not_hold_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor, told, ending, handle = _watched(tmp_path, monkeypatch)

    ending.gate.clear()  # reading the logs takes a while
    ending.status = AttemptStatus(AttemptPhase.SUCCEEDED, exit_code=0)
    assert executor.poll(handle).phase is AttemptPhase.RUNNING  # what it said before
    assert executor.poll(handle).phase is AttemptPhase.RUNNING  # one ending, not two
    assert told == [] and not (tmp_path / "exit.json").exists()

    ending.gate.set()
    executor.close()  # waits for the ending
    assert told == [7]  # the loop is told, and its next poll reads the outcome
    assert ending.kept == ["ty-7-1"]
    final = executor.poll(handle)
    assert final.phase is AttemptPhase.SUCCEEDED and final.exit_code == 0
    assert executor._ending == {} and executor._last_status == {}


def test_a_failed_ending_is_raised_by_the_next_poll_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor, told, ending, handle = _watched(tmp_path, monkeypatch)
    ending.status = AttemptStatus(AttemptPhase.FAILED, exit_code=1, reason="rank 1 exited 1")
    ending.stop_fails = True
    assert executor.poll(handle).phase is AttemptPhase.RUNNING
    executor._ending["ty-7-1"].exception(timeout=10)  # done, with the error
    with pytest.raises(ExecutorError, match="503"):
        executor.poll(handle)  # as a poll that ended it on the loop would have raised
    ending.stop_fails = False
    assert executor.poll(handle).phase is AttemptPhase.RUNNING  # tried again
    executor.close()
    assert told == [7]
    assert executor.poll(handle).phase is AttemptPhase.FAILED
    assert ending.kept == ["ty-7-1", "ty-7-1"]  # kept logs are never rewritten (`_keep_logs`)


def test_without_the_watches_a_poll_ends_the_attempt_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = _executor(tmp_path)
    ending = _Ending(executor, monkeypatch)
    handle = _handle(tmp_path)
    executor.poll(handle)
    ending.status = AttemptStatus(AttemptPhase.SUCCEEDED, exit_code=0)
    assert executor.poll(handle).phase is AttemptPhase.SUCCEEDED
    assert (tmp_path / "exit.json").exists() and ending.kept == ["ty-7-1"]
    assert executor._enders is None


def test_after_a_restart_the_first_poll_of_an_ended_attempt_ends_it_on_the_spot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new control plane has no earlier answer to give while an ending runs: it ends the
    attempt in the poll, as before."""
    executor = _executor(tmp_path)
    executor.report_changes(lambda job: None)
    ending = _Ending(executor, monkeypatch)
    ending.status = AttemptStatus(AttemptPhase.SUCCEEDED, exit_code=0)
    assert executor.poll(_handle(tmp_path)).phase is AttemptPhase.SUCCEEDED
    assert executor._enders is None
