"""The pure scheduling core: a snapshot in, decisions out. No I/O, no clock, no randomness.

    scheduler = Scheduler(SchedulerConfig())
    decisions = scheduler.schedule(snapshot, now=time_from_the_caller)

One cycle reads as numbered phases (see ``core.Cycle.run``):

1. derive free capacity per node from the running workloads; index it per GPU model and
   leaf switch;
2. charge running workloads to the queue/cohort quota tree; decay the usage history;
3. sort each queue's pending workloads (priority, attained-service level, submit time);
4. repeatedly take the best queue head (priority; fits its nominal quota before borrows;
   service level; weighted dominant fair share; submit time) and try, in order: admit
   within quota (borrowing inside the cohort within limits) on a topology-aware placement;
   backfill onto reserved nodes if its runtime estimate ends before the reserved start;
   preempt (reclaim of lent quota, lower priority, or attained service, also of other
   queues' long runners on borrowed quota) choosing victims that lose the least work since
   their last checkpoint (node by node when the cheapest victims are scattered), and keep
   for it the GPUs those free; when it fails on placement alone although enough GPUs are
   free in total, move small jobs to clear whole nodes (defragmentation); reserve nodes for
   it as the head of line; a queue is skipped once nothing behind
   its head could start; finally offer reserved GPUs to short work (backfill pass);
5. return admissions, preemptions (with a grace period to checkpoint), reservations, the
   updated usage history, and for every pending workload a reason and an estimated start.

Phases 1-3 build one ``cycle_state.CycleState``, a few parts that each own their data
behind methods (``views``: capacity, quota, running work; ``ledger``: queues, decisions,
budgets). In phase 4 each visited queue head is an ``entry.Entry`` that carries its own
assignment (nodes, victims, held nodes) and outcome; modules split by concern
(``admission``, ``placement``, ``victims``/``preemption``, ``defrag``, ``reservation``,
``ordering``) fill it in, and the cycle applies it. Runtime estimates come from
``estimates.RuntimeEstimator`` (history of finished jobs, bounded by ``max_runtime``), shared
with the simulator.

Policies and their knobs live in :class:`SchedulerConfig`; queues and cohorts come from
``tensoryard.spec.QuotaConfig``.

Ranking used by preemption ("a victim never outranks the job it makes room for"): a workload
running on *borrowed* quota ranks below every workload that runs within its queue's nominal
quota; after that, higher priority ranks higher; at equal priority, a lower attained-service
level ranks higher. Victims are always strictly below their preemptor in this order, except
for defragmentation, which moves rather than displaces: its victims are smaller single-node
jobs at no higher priority and no lower level, and only as many as can restart at once on
GPUs that stay free.
"""

from tensoryard.scheduler.accounting import decay_usage
from tensoryard.scheduler.config import SchedulerConfig
from tensoryard.scheduler.convert import nodes_from_cluster, workload_from_job
from tensoryard.scheduler.core import Scheduler
from tensoryard.scheduler.estimates import EstimatorConfig, JobFeatures, RuntimeEstimator
from tensoryard.scheduler.model import (
    Admission,
    DecayedUsage,
    Decisions,
    Node,
    PendingInfo,
    Placement,
    Preemption,
    Snapshot,
    Topology,
    Workload,
)
from tensoryard.spec.queue import CohortSpec, QueueSpec, QuotaConfig

__all__ = [
    "Admission",
    "CohortSpec",
    "DecayedUsage",
    "Decisions",
    "EstimatorConfig",
    "JobFeatures",
    "Node",
    "PendingInfo",
    "Placement",
    "Preemption",
    "QueueSpec",
    "QuotaConfig",
    "RuntimeEstimator",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "Topology",
    "Workload",
    "decay_usage",
    "nodes_from_cluster",
    "workload_from_job",
]
