"""The autoscaler: up at once on queue depth or a slow p90 TTFT, down only after the
stabilisation window, always within [replicas, max_replicas]."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tensoryard.serving.autoscale import AutoscalePolicy, Autoscaler
from tensoryard.spec.deployment import DeploymentSpec


def test_queue_depth_scales_up_at_once_and_down_only_after_the_window() -> None:
    a = Autoscaler(AutoscalePolicy(1, 4, target_queue=2, scale_down_after_s=60))
    assert a.decide(0, load=0, current=1) == 1
    assert a.decide(1, load=5, current=1) == 3  # ceil(5 / 2)
    assert a.reason.startswith("up: 5 requests")
    assert a.decide(2, load=20, current=3) == 4  # capped at max_replicas
    assert a.decide(3, load=0, current=4) == 4  # quiet, but 4 were wanted a second ago
    assert a.decide(61, load=0, current=4) == 4  # the 4 wanted at t=2 is still in the window
    assert a.decide(63, load=0, current=4) == 1  # nothing above 1 wanted for 60 s
    assert a.reason.startswith("down:")


def test_a_brief_lull_does_not_scale_down() -> None:
    a = Autoscaler(AutoscalePolicy(1, 4, target_queue=1, scale_down_after_s=30))
    a.decide(0, load=3, current=1)
    for t in range(1, 30):  # load comes and goes within the window
        a.decide(t, load=3 if t % 10 == 0 else 0, current=3)
        assert a.desired == 3


def test_a_slow_p90_ttft_adds_one_replica_when_none_is_starting() -> None:
    a = Autoscaler(AutoscalePolicy(1, 5, target_queue=100, target_ttft_s=1.0))
    for i in range(10):
        a.observe_ttft(float(i), 0.5 if i < 8 else 3.0)  # p90 = 3.0 s
    assert a.ttft_p90(10) == 3.0
    assert a.decide(10, load=2, current=2, starting=1) == 1  # a replica is still starting
    assert a.decide(10, load=2, current=2) == 3
    assert "TTFT" in a.reason
    # the samples from before the scale-up are forgotten: no runaway while nothing new is slow
    assert a.ttft_p90(11) is None
    assert a.decide(11, load=2, current=3) == 3


def test_no_load_means_no_ttft_scale_up_and_the_minimum_holds() -> None:
    a = Autoscaler(AutoscalePolicy(2, 5, target_ttft_s=0.1, scale_down_after_s=0))
    a.observe_ttft(0, 9.0)
    assert a.decide(1, load=0, current=2) == 2


def test_ttft_samples_older_than_the_window_do_not_count() -> None:
    a = Autoscaler(AutoscalePolicy(1, 3, target_ttft_s=1.0, window_s=30))
    a.observe_ttft(0, 5.0)
    assert a.ttft_p90(31) is None
    assert a.decide(31, load=1, current=1) == 1


def test_scale_from_zero_with_autoscaling() -> None:
    a = Autoscaler(AutoscalePolicy(0, 2, target_queue=1, scale_down_after_s=5))
    assert a.decide(0, load=0, current=0) == 0
    assert a.decide(1, load=1, current=0) == 1  # a held request wakes it
    assert a.decide(7, load=0, current=1) == 0


def test_the_spec_names_the_field_when_max_is_below_the_minimum() -> None:
    with pytest.raises(ValidationError) as err:
        DeploymentSpec.model_validate(
            {"model": "m.gguf", "replicas": 3, "autoscale": {"max_replicas": 2}}
        )
    text = str(err.value)
    assert "autoscale" in text and "raise autoscale.max_replicas or lower replicas" in text
    with pytest.raises(ValidationError, match="target_queue"):
        DeploymentSpec.model_validate(
            {"model": "m.gguf", "autoscale": {"max_replicas": 2, "target_queue": 0}}
        )
    spec = DeploymentSpec.model_validate(
        {"model": "m.gguf", "replicas": 1, "autoscale": {"max_replicas": 3, "target_ttft_s": 2}}
    )
    assert spec.stored_options()["autoscale"]["max_replicas"] == 3
    assert spec.stored_options()["router"] == "prefix"
