"""SchedulerConfig: every policy knob of the scheduling core, with its default and meaning."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tensoryard.errors import ConfigError

__all__ = ["SchedulerConfig", "load_scheduler_config", "scheduler_config_from"]


# How long a pending workload that preemptions were made for keeps first pick of the room
# made for it (Workload.reclaiming); the callers (server, simulator) keep that memory.
RECLAIM_MEMORY_S = 900.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Policy knobs. The defaults are the platform's default policy (all policies on).

    Attributes:
        fair_share_half_life_s: half-life of the usage history used for fair share; 0 turns
            history off (only current usage counts).
        history_weight: how much decayed past usage counts against current usage in a queue's
            fair share, from 0 (only now) to 1 (only history).
        service_levels_gpu_s: thresholds of attained service (GPU-seconds over all attempts)
            that split workloads into levels 0, 1, 2, ... (discretised least-attained-service,
            as in Tiresias). Within a queue a lower level goes first; () turns levels off.
            Uses only observed service, never true durations.
        nominal_first: at equal priority, queue heads that fit in their queue's nominal quota
            go before heads that would borrow, so GPUs reclaimed for a lender reach the lender
            and do not bounce back to the borrower (Kueue orders the same way).
        service_level_across_queues: order queue heads by service level before fair share,
            so a newcomer of any team goes before a long-runner of another (Tiresias-like).
        reclaim: a queue below its nominal quota may preempt workloads of cohort queues that
            borrow, to get its quota back.
        reclaim_min_run_s: least run time of a borrower's attempt before reclaim may stop it
            (Slurm's PreemptExemptTime, for reclaim only). A job admitted into idle cohort room
            is not taken back before it has got going: a restart costs the job its start-up
            (image, data, distributed init) besides the work since its checkpoint, and
            reclaiming fresh borrowers at once turns a burst into a churn of admissions and
            preemptions. The lender waits at most this long plus the victim's grace; its
            pending reason says when the borrowed GPUs become reclaimable. 0: at once.
        preempt_lower_priority: a workload may preempt lower-priority workloads of its queue.
        preempt_by_service: a pending workload may preempt a running one of its own queue with
            the same priority and a higher service level, once the victim ran at least
            `service_preemption_min_run_s` in its current attempt (other queues' work is only
            taken back by `reclaim`). The victim resumes later from its checkpoint.
        service_preemption_min_run_s: least run time of an attempt before service preemption
            may stop it (prevents thrashing).
        service_preemption_of_borrowers: a pending workload may also preempt, for service, a
            running workload of another queue of its cohort tree that runs on borrowed quota,
            at the same priority and a higher service level, after the same least run time;
            the victim's queue keeps at least its nominal quota (reason "borrowed-service").
            Without it, a team that always borrows has its newcomers wait behind other teams'
            long runners, where Tiresias-like LAS would let them in.
        preemption_grace_s: seconds a victim gets to checkpoint before it is stopped.
        defragment: when a multi-GPU workload fails on placement alone (enough GPUs are free
            in total, but scattered over nodes), preempt single-node workloads narrower than its
            workers that do not outrank it (priority <= its own, service level >= its own)
            to clear whole nodes (at most one such search per cycle),
            least work lost first, and only as many as can restart at once on the GPUs left
            free: the victims migrate, they are not displaced (reason "defragment").
        defrag_min_run_s: least run time of an attempt before defragmentation may move it
            (each workload moves at most once per such period).
        max_preemptors_per_cycle: at most this many pending workloads issue preemptions in one
            cycle (bounds churn and cycle time).
        max_victim_candidates: at most this many cheapest candidates are tried per preemptor.
        preempt_attempts_per_preemptor: a cycle gives up on preemption after this many
            searches per allowed preemptor (``max_preemptors_per_cycle``), successful or not.
        node_aware_tries: per cycle, at most this many node-by-node victim searches (used
            when the cheapest victims of a multi-GPU workload are scattered over nodes).
        node_aware_spare_nodes: such a search clears at most the gang's node count plus this
            many of the nodes cheapest to clear.
        borrowed_service_tries: per cycle, at most this many preemption searches that look
            at other queues' long runners on borrowed quota ("borrowed-service").
        defrag_tries: defragmentation searches per cycle (each looks at every node of a model).
        placement_failure_cache: per capacity index, remember at most this many request
            shapes that found no placement this cycle (a larger request then fails at once).
        max_reservations: head-of-line reservations per cycle: the first this-many workloads
            that fit quota but not capacity get nodes held for them; others may use those nodes
            only if their runtime estimate ends before the reserved start (backfill).
        backfill_depth: how many waiting workloads (split evenly among queues) the backfill
            pass examines per cycle for reserved GPUs; bounds cycle time with huge backlogs.
        cpu_on_gpu_nodes: CPU-only workloads may run on GPU nodes when CPU-only nodes are full.
        ordering_tiebreak_by_id: break exact ties (same priority, level and submit time) by
            workload id, so decisions do not depend on the snapshot's order; False keeps the
            snapshot's order for such ties.
    """

    fair_share_half_life_s: float = 3600.0
    history_weight: float = 0.5
    service_levels_gpu_s: tuple[float, ...] = (3600.0, 8 * 3600.0)
    service_level_across_queues: bool = True
    nominal_first: bool = True
    reclaim: bool = True
    reclaim_min_run_s: float = 60.0
    preempt_lower_priority: bool = True
    preempt_by_service: bool = True
    service_preemption_min_run_s: float = 600.0
    service_preemption_of_borrowers: bool = True
    preemption_grace_s: float = 120.0
    defragment: bool = True
    defrag_min_run_s: float = 600.0
    max_preemptors_per_cycle: int = 32
    max_victim_candidates: int = 64
    preempt_attempts_per_preemptor: int = 4
    node_aware_tries: int = 1
    node_aware_spare_nodes: int = 4
    borrowed_service_tries: int = 8
    defrag_tries: int = 1
    placement_failure_cache: int = 32
    max_reservations: int = 1
    backfill_depth: int = 2048
    cpu_on_gpu_nodes: bool = True
    ordering_tiebreak_by_id: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.fair_share_half_life_s >= 0, "fair_share_half_life_s must be >= 0"),
            (0.0 <= self.history_weight <= 1.0, "history_weight must be between 0 and 1"),
            (
                list(self.service_levels_gpu_s) == sorted(set(self.service_levels_gpu_s))
                and all(t > 0 for t in self.service_levels_gpu_s),
                "service_levels_gpu_s must be positive and strictly increasing",
            ),
            (self.reclaim_min_run_s >= 0, "reclaim_min_run_s must be >= 0"),
            (self.service_preemption_min_run_s >= 0, "service_preemption_min_run_s must be >= 0"),
            (self.preemption_grace_s >= 0, "preemption_grace_s must be >= 0"),
            (self.defrag_min_run_s >= 0, "defrag_min_run_s must be >= 0"),
            (self.max_preemptors_per_cycle >= 0, "max_preemptors_per_cycle must be >= 0"),
            (self.max_victim_candidates >= 1, "max_victim_candidates must be >= 1"),
            (self.max_reservations >= 0, "max_reservations must be >= 0"),
            (
                self.preempt_attempts_per_preemptor >= 1,
                "preempt_attempts_per_preemptor must be >= 1",
            ),
            (self.node_aware_tries >= 0, "node_aware_tries must be >= 0"),
            (self.node_aware_spare_nodes >= 0, "node_aware_spare_nodes must be >= 0"),
            (self.borrowed_service_tries >= 0, "borrowed_service_tries must be >= 0"),
            (self.defrag_tries >= 0, "defrag_tries must be >= 0"),
            (self.placement_failure_cache >= 0, "placement_failure_cache must be >= 0"),
            (self.backfill_depth >= 0, "backfill_depth must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"scheduler config: {message} (fix: change that setting)")

    @property
    def max_preempt_attempts(self) -> int:
        """Preemption searches a cycle may make in all."""
        return self.preempt_attempts_per_preemptor * max(1, self.max_preemptors_per_cycle)

    def service_level(self, gpu_seconds: float) -> int:
        """Level of a workload that attained `gpu_seconds` of service (0 = least)."""
        level = 0
        for threshold in self.service_levels_gpu_s:
            if gpu_seconds < threshold:
                break
            level += 1
        return level


def _coerce(key: str, kind: Any, value: Any, source: str) -> Any:
    """`value` as the type of field `key`, or a ConfigError naming the field and the fix."""
    kind = str(kind)
    wrong = f"{source}: {key} = {value!r}"
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{wrong} is not a boolean (fix: true or false)")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{wrong} is not a whole number (fix: e.g. {key} = 4)")
    if kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{wrong} is not a number (fix: seconds or a ratio, e.g. 60)")
    # tuple[float, ...]: the service-level thresholds
    items = [value] if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(items, list | tuple) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in items
    ):
        raise ConfigError(
            f"{wrong} is not a list of numbers (fix: e.g. [3600, 28800]; [] for none)"
        )
    return tuple(float(v) for v in items)


def scheduler_config_from(
    values: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    *,
    source: str = "scheduler settings",
    option: str = "--scheduler",
) -> SchedulerConfig:
    """A :class:`SchedulerConfig` from a mapping (a YAML file's) and then ``KEY=VALUE``
    overrides (values parsed as JSON, else taken as text: ``reclaim_min_run_s=120``,
    ``service_levels_gpu_s=[3600,28800]``, ``defragment=false``). Unknown keys, wrong types
    and out-of-range values raise a ConfigError that names the setting and the fix."""
    fields = {f.name: f.type for f in dataclasses.fields(SchedulerConfig)}
    merged: dict[str, tuple[Any, str]] = {}
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping of setting: value, got {type(values).__name__} "
            "(fix: e.g. 'reclaim_min_run_s: 120')"
        )
    for key, value in (values or {}).items():
        merged[str(key)] = (value, source)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{option} {item!r}: use KEY=VALUE (fix: e.g. reclaim_min_run_s=120)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw.strip()
        merged[key] = (value, f"{option} {item!r}")
    unknown = sorted(k for k in merged if k not in fields)
    if unknown:
        raise ConfigError(
            f"{merged[unknown[0]][1]}: unknown scheduler setting {unknown[0]!r} "
            f"(fix: one of {', '.join(sorted(fields))})"
        )
    kwargs = {k: _coerce(k, fields[k], v, where) for k, (v, where) in merged.items()}
    try:
        return SchedulerConfig(**kwargs)
    except ConfigError as exc:
        where = sorted({w for _, w in merged.values()})
        raise ConfigError(f"{', '.join(where) or source}: {exc}") from None


def load_scheduler_config(path: Path | None, overrides: Iterable[str] = ()) -> SchedulerConfig:
    """``tyard server --scheduler-config FILE --scheduler KEY=VALUE``: a YAML mapping of
    settings (an optional top-level ``scheduler:`` key holds them), then the overrides."""
    values: Any = None
    if path is not None:
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"cannot read scheduler settings {path}: {exc.strerror or exc} (fix: pass an "
                "existing YAML file to --scheduler-config)"
            ) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"{path}: not valid YAML: {exc} (fix: a mapping such as 'reclaim_min_run_s: 120')"
            ) from exc
        if isinstance(values, Mapping) and set(values) == {"scheduler"}:
            values = values["scheduler"]
        values = values or {}
    return scheduler_config_from(values, overrides, source=str(path) if path else "settings")
