"""Team quotas for a replay: equal shares in one cohort by default, or a QueueSpec file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tensoryard.errors import ConfigError
from tensoryard.spec.queue import QueueSpec, QuotaConfig, load_quota_config

__all__ = ["DEFAULT_COHORT", "equal_quotas", "load_quotas", "nominal_gpus"]

DEFAULT_COHORT = "trace"


def equal_quotas(teams: Iterable[str], total_gpus: int, gpu_model: str) -> QuotaConfig:
    """Every team gets an equal nominal share of ``total_gpus`` in one cohort.

    The remainder of the division goes one GPU each to the first teams (sorted by name), so
    the nominal quotas add up to the cluster exactly.
    """
    names = sorted(set(teams))
    if not names:
        raise ConfigError("the trace names no teams (fix: give every row a team)")
    base, extra = divmod(total_gpus, len(names))
    queues = [
        QueueSpec(
            name=name,
            cohort=DEFAULT_COHORT,
            nominal={gpu_model: base + (1 if i < extra else 0)},
        )
        for i, name in enumerate(names)
    ]
    return QuotaConfig.build(queues)


def load_quotas(path: str | Path, teams: Iterable[str], gpu_model: str) -> QuotaConfig:
    """Read a quota file and check that it gives every team of the trace a queue."""
    config = load_quota_config(path)
    missing = sorted(t for t in set(teams) if config.queue(t) is None)
    if missing:
        raise ConfigError(
            f"{path}: teams {', '.join(missing)} of the trace have no queue (fix: add a queue "
            f"for each, like '- {{name: {missing[0]}, cohort: {DEFAULT_COHORT}, nominal: "
            f"{{{gpu_model}: 8}}}}')"
        )
    if gpu_model not in config.gpu_models:
        raise ConfigError(
            f"{path}: no queue has quota for GPU model {gpu_model!r}, the cluster's model "
            f"(fix: name it in 'nominal', or write the model in the shape, like 64x8:MODEL)"
        )
    return config


def nominal_gpus(config: QuotaConfig, gpu_model: str) -> dict[str, int]:
    """Queue name -> nominal GPUs of ``gpu_model``."""
    return {q.name: q.nominal.get(gpu_model, 0) for q in config.queues}
