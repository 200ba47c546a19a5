"""Run-time estimates from history: one estimator for the control plane and the simulator.

In the spirit of Helios' QSSF (Hu et al., SC'21: a job's run time is predicted from the same
user's earlier jobs with a similar name) and Lucid (Hu et al., ASPLOS'23: interpretable
estimates from a few job features, updated as jobs finish), a job is described by team, user,
job name and GPU count, and its estimate is a quantile of the recent run times of the most
specific group of finished jobs that has enough history:

    (team, user, name, GPUs) -> (team, user, name) -> (team, user, GPUs) -> (team, GPUs) -> team

Job names are compared without a trailing run number ("sft-llama-7" and "sft-llama-8" are
one group), as Helios groups names by similarity. The user's ``max_runtime`` is an upper
bound on every estimate, and the estimate when there is no history at all. Without history
and without a bound the answer is None ("unknown"), never a guess.

The estimator is pure (no clock, no I/O); its whole state is a JSON-able dict
(:meth:`RuntimeEstimator.to_state` / :meth:`RuntimeEstimator.from_state`), so the control plane
can keep it in its store across restarts. It also measures its own accuracy: each observed
run is compared with what it would have predicted just before.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ConfigError

__all__ = [
    "EstimatorConfig",
    "JobFeatures",
    "RuntimeEstimator",
    "attempt_estimate",
    "name_group",
]

STATE_VERSION = 1
_TRAILING_RUN = re.compile(r"[-_.]?\d+$")
_SEP = "\x1f"


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimatorConfig:
    """How run times are learnt.

    Attributes:
        window: run times remembered per group (the most recent ones).
        min_samples: a group answers only when it remembers at least this many runs;
            otherwise the next, coarser group answers.
        quantile: the estimate is this quantile of the remembered runs (0.5: the median;
            higher is more cautious for backfill, lower favours short jobs).
    """

    window: int = 32
    min_samples: int = 1
    quantile: float = 0.5

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_samples < 1 or self.min_samples > self.window:
            raise ConfigError(
                "estimator config: need 1 <= min_samples <= window (fix: change those settings)"
            )
        if not 0.0 <= self.quantile <= 1.0:
            raise ConfigError("estimator config: quantile must be between 0 and 1")


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What the estimator may know about a job: never its true duration.

    Attributes:
        team: the team (queue) that runs it.
        gpus: GPUs in total (nodes x GPUs per node; 0 for CPU-only jobs).
        user: who submitted it (None when unknown, as in public traces).
        name: the job's name (None when unknown).
        max_runtime_s: the user's limit on its run time, or None.
    """

    team: str
    gpus: int
    user: str | None = None
    name: str | None = None
    max_runtime_s: float | None = None


def name_group(name: str) -> str:
    """A job name without its trailing run number: "sft-llama-7" -> "sft-llama"."""
    stripped = _TRAILING_RUN.sub("", name)
    return stripped or name


def _groups(job: JobFeatures) -> list[str]:
    """Group keys from the most specific to the coarsest."""
    gpus = str(job.gpus)
    keys: list[tuple[str, ...]] = []
    if job.user is not None and job.name is not None:
        name = name_group(job.name)
        keys.append(("tung", job.team, job.user, name, gpus))
        keys.append(("tun", job.team, job.user, name))
    if job.user is not None:
        keys.append(("tug", job.team, job.user, gpus))
    keys.append(("tg", job.team, gpus))
    keys.append(("t", job.team))
    return [_SEP.join(k) for k in keys]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) % 2 == 0 and q == 0.5:
        mid = len(ordered) // 2
        return (ordered[mid - 1] + ordered[mid]) / 2.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RuntimeEstimator:
    """Learns run times of finished jobs and predicts those of new ones."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self._runs: dict[str, deque[float]] = {}
        self._answer: dict[str, float] = {}
        self.version = 0  # bumped by every observation: estimates made before may be stale
        # accuracy of the predictions made just before each observation
        self._observed = 0
        self._predicted = 0
        self._within_2x = 0
        self._abs_error_s = 0.0
        self._abs_log2 = 0.0
        self._over_bound = 0

    # --- learning and predicting ----------------------------------------------------------

    def observe(self, job: JobFeatures, run_s: float) -> None:
        """Learn that `job` ran `run_s` seconds to completion."""
        if run_s < 0 or not math.isfinite(run_s):
            return
        self.version += 1
        self._score(job, run_s)
        for key in _groups(job):
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = deque(maxlen=self.config.window)
            runs.append(run_s)
            if len(runs) >= self.config.min_samples:
                self._answer[key] = _quantile(list(runs), self.config.quantile)

    def estimate(self, job: JobFeatures) -> float | None:
        """Predicted run time of `job` in seconds, at most its ``max_runtime_s``; None when
        there is neither history nor a bound."""
        answer = self._answer
        for key in _groups(job):
            found = answer.get(key)
            if found is not None:
                bound = job.max_runtime_s
                return found if bound is None else min(found, bound)
        return job.max_runtime_s

    def _score(self, job: JobFeatures, run_s: float) -> None:
        self._observed += 1
        if job.max_runtime_s is not None and run_s > job.max_runtime_s:
            self._over_bound += 1
        guess = self.estimate(job)
        if guess is None:
            return
        self._predicted += 1
        self._abs_error_s += abs(guess - run_s)
        ratio = max(guess, 1.0) / max(run_s, 1.0)
        self._abs_log2 += abs(math.log2(ratio))
        if 0.5 <= ratio <= 2.0:
            self._within_2x += 1

    def accuracy(self) -> dict[str, float]:
        """How good the predictions made before each observed run were.

        ``coverage``: share of runs that had a prediction; ``within_2x``: share of predicted
        runs whose prediction was within a factor of two; ``mean_abs_error_s`` and
        ``mean_abs_log2_ratio`` over predicted runs (0 is perfect; 1 means off by 2x).
        """
        predicted = max(1, self._predicted)
        return {
            "observed": float(self._observed),
            "coverage": self._predicted / self._observed if self._observed else 0.0,
            "within_2x": self._within_2x / predicted,
            "mean_abs_error_s": self._abs_error_s / predicted,
            "mean_abs_log2_ratio": self._abs_log2 / predicted,
            "ran_past_max_runtime": float(self._over_bound),
        }

    # --- state ------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Everything learnt, as JSON-able data (see :meth:`from_state`)."""
        return {
            "version": STATE_VERSION,
            "runs": {key: list(runs) for key, runs in self._runs.items()},
            "accuracy": [
                self._observed,
                self._predicted,
                self._within_2x,
                self._abs_error_s,
                self._abs_log2,
                self._over_bound,
            ],
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], config: EstimatorConfig | None = None
    ) -> RuntimeEstimator:
        """An estimator that continues from :meth:`to_state` output."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"estimator state version {state.get('version')!r} is not {STATE_VERSION} "
                "(fix: drop the stored state; it is relearnt from finished jobs)"
            )
        out = cls(config)
        for key, runs in state.get("runs", {}).items():
            kept = deque((float(r) for r in runs), maxlen=out.config.window)
            out._runs[str(key)] = kept
            if len(kept) >= out.config.min_samples:
                out._answer[str(key)] = _quantile(list(kept), out.config.quantile)
        acc = list(state.get("accuracy", [0, 0, 0, 0.0, 0.0, 0]))
        out._observed, out._predicted, out._within_2x = int(acc[0]), int(acc[1]), int(acc[2])
        out._abs_error_s, out._abs_log2, out._over_bound = float(acc[3]), float(acc[4]), int(acc[5])
        return out


def attempt_estimate(typical_s: float | None, attained_s: float, ran_s: float) -> float | None:
    """Expected length of a running attempt: what is left of the typical run after
    `attained_s` of earlier attempts; once the attempt has run `ran_s` past that, twice what
    it has run so far, doubling again as needed (it is evidently not typical)."""
    if typical_s is None:
        return None
    estimate = max(typical_s - attained_s, 1.0)
    while estimate < ran_s:
        estimate *= 2
    return estimate
