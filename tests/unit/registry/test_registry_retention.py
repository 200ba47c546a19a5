"""Checkpoint retention plans: keep last N, best by a metric, every K; newest and registered
steps always stay."""

from __future__ import annotations

import pytest

from tensoryard.errors import SpecError
from tensoryard.registry.retention import RetentionPolicy, plan_retention
from tensoryard.store import CheckpointRecord

STEPS = [50, 100, 150, 200, 250, 300]
LOSS = {50: 3.0, 100: 2.0, 150: 1.2, 200: 1.5, 250: 1.4, 300: 1.6}


def _ckpts() -> list[CheckpointRecord]:
    return [CheckpointRecord(1, 1, s, f"/ckpt/step-{s}", float(s), None) for s in STEPS]


@pytest.mark.parametrize(
    ("policy", "pinned", "kept"),
    [
        (RetentionPolicy(keep_last=2), (), [250, 300]),
        (RetentionPolicy(keep_best=2, metric="eval_loss"), (), [150, 250, 300]),
        (RetentionPolicy(keep_best=1, metric="eval_loss", mode="max"), (), [50, 300]),
        (RetentionPolicy(keep_every=100), (), [100, 200, 300]),
        (RetentionPolicy(keep_last=1, keep_every=150), (), [150, 300]),
        (RetentionPolicy(keep_last=1), (100,), [100, 300]),
        (RetentionPolicy(), (), STEPS),
    ],
    ids=[
        "the last two",
        "the best two by loss, and the newest",
        "the best by a higher-is-better metric, and the newest",
        "every 100 steps",
        "rules combine: a checkpoint kept by any rule stays",
        "a registered step stays",
        "no rule keeps everything",
    ],
)
def test_a_retention_plan_keeps_what_some_rule_asks_for(
    policy: RetentionPolicy, pinned: tuple[int, ...], kept: list[int]
) -> None:
    metrics = {s: {"eval_loss": v} for s, v in LOSS.items()}
    plan = plan_retention(_ckpts(), metrics, policy, pinned=pinned)

    assert [c.step for c in plan.keep] == kept
    assert sorted(c.step for c in plan.keep + plan.delete) == STEPS
    assert "newest" in plan.reasons[300]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"keep_last": 0}, "keep_last"),
        ({"keep_best": 2}, "metric"),
        ({"keep_every": -5}, "keep_every"),
    ],
    ids=["keep_last of zero", "keep_best without a metric", "a negative keep_every"],
)
def test_a_bad_policy_names_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(SpecError) as err:
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]
    assert [i.path for i in err.value.issues] == [field]
