"""The run-time estimator shared by the control plane and the simulator."""

from __future__ import annotations

import json

import pytest

from tensoryard.errors import ConfigError
from tensoryard.scheduler.estimates import (
    EstimatorConfig,
    JobFeatures,
    RuntimeEstimator,
    attempt_estimate,
    name_group,
)
from tensoryard.scheduler.model import DecayedUsage
from tensoryard.server.scheduling import CorePolicy


def _job(name: str = "sft-llama-1", gpus: int = 8, **kw: object) -> JobFeatures:
    return JobFeatures(
        team=str(kw.get("team", "nlp")),
        gpus=gpus,
        user=str(kw.get("user", "ada")),
        name=name,
        max_runtime_s=kw.get("max_runtime_s"),  # type: ignore[arg-type]
    )


def test_without_history_or_bound_the_estimate_is_unknown_not_a_guess() -> None:
    assert RuntimeEstimator().estimate(_job()) is None


def test_without_history_the_users_max_runtime_is_the_estimate() -> None:
    assert RuntimeEstimator().estimate(_job(max_runtime_s=7200.0)) == 7200.0


def test_max_runtime_bounds_an_estimate_learnt_from_history() -> None:
    est = RuntimeEstimator()
    est.observe(_job(), 10_000.0)
    assert est.estimate(_job(max_runtime_s=3600.0)) == 3600.0
    assert est.estimate(_job()) == 10_000.0


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        (_job("sft-llama-9", 8), 100.0),
        (_job("sft-llama-9", 2), 150.0),
        (_job("eval", 4), 200.0),
        (_job("eval", 8, user="carl"), 1000.0),
        (_job("eval", 2, user="carl"), 400.0),
    ],
    ids=[
        "the same user, name group and size answer first",
        "the user's name group answers for another size",
        "the user's jobs of that size answer for a new name",
        "the team's jobs of that size answer for a new user",
        "the whole team answers when nothing closer has history",
    ],
)
def test_the_most_specific_group_with_history_answers(asked: JobFeatures, expected: float) -> None:
    est = RuntimeEstimator()
    est.observe(_job("sft-llama-1", 8), 100.0)
    est.observe(_job("sft-llama-2", 4), 200.0)
    est.observe(_job("pretrain-1", 8, user="eve"), 1000.0)
    est.observe(_job("pretrain-2", 8, user="eve"), 1000.0)
    est.observe(_job("x-1", 4, user="bob"), 400.0)
    assert est.estimate(asked) == pytest.approx(expected)


def test_names_are_grouped_without_their_trailing_run_number() -> None:
    assert name_group("sft-llama-7") == name_group("sft-llama-8") == "sft-llama"
    assert name_group("42") == "42"


def test_a_running_attempt_that_outlives_its_estimate_doubles_it() -> None:
    assert attempt_estimate(None, 0.0, 10.0) is None
    assert attempt_estimate(1000.0, 400.0, 100.0) == 600.0
    assert attempt_estimate(1000.0, 0.0, 2500.0) == 4000.0


def test_accuracy_scores_the_prediction_made_before_each_observation() -> None:
    est = RuntimeEstimator()
    est.observe(_job(), 100.0)  # no prediction yet
    est.observe(_job(), 150.0)  # predicted 100: within 2x
    est.observe(_job(), 1000.0)  # predicted median(100, 150) = 125: off by 8x
    acc = est.accuracy()
    assert acc["observed"] == 3
    assert acc["coverage"] == pytest.approx(2 / 3)
    assert acc["within_2x"] == pytest.approx(0.5)
    assert acc["mean_abs_error_s"] == pytest.approx((50 + 875) / 2)


def test_state_round_trips_through_json_and_keeps_learning() -> None:
    est = RuntimeEstimator(EstimatorConfig(window=3))
    for run in (100.0, 200.0, 300.0, 400.0):
        est.observe(_job(), run)
    back = RuntimeEstimator.from_state(
        json.loads(json.dumps(est.to_state())), EstimatorConfig(window=3)
    )
    assert back.estimate(_job()) == est.estimate(_job()) == 300.0
    assert back.accuracy() == est.accuracy()
    back.observe(_job(), 500.0)
    assert back.estimate(_job()) == 400.0  # the window keeps the last three runs


def test_a_state_of_another_version_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="drop the stored state"):
        RuntimeEstimator.from_state({"version": 99})


def test_core_policy_exports_estimator_and_usage_history_as_json_and_imports_them() -> None:
    policy = CorePolicy()
    policy.observe_completion(
        team="nlp", user="ada", job_name="sft-1", gpus=8, run_s=3600.0, max_runtime_s=None
    )
    policy.import_state(
        {
            **policy.export_state(),
            "usage_history": {"nlp": {"gpu_seconds": {"H100": 1234.5}, "as_of": 99.0}},
        }
    )
    state = json.loads(json.dumps(policy.export_state()))
    fresh = CorePolicy()
    fresh.import_state(state)
    assert fresh.estimator.estimate(JobFeatures("nlp", 8, "ada", "sft-2")) == 3600.0
    assert fresh.export_state() == state
    assert fresh._history == {"nlp": DecayedUsage({"H100": 1234.5}, 99.0)}


def test_core_policy_refuses_a_state_of_another_version() -> None:
    with pytest.raises(ConfigError, match="scheduler state version"):
        CorePolicy().import_state({"version": 2})
