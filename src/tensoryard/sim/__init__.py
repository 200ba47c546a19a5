"""Trace-driven replay of the scheduler, with baseline policies and metrics.

    result = simulate(load_trace("philly.csv"), parse_cluster_shape("64x8"),
                      make_policy("default"), quotas)
    result.metrics()["avg_jct_s"]

The ``default`` policy runs the production scheduling core (``tensoryard.scheduler``)
unchanged; ``fifo``, ``sjf-oracle``, ``tiresias-las`` and ``kueue-like`` are baselines in the
same simulator. See :mod:`tensoryard.sim.metrics` for what each metric means.
"""

from tensoryard.sim.cluster import ClusterShape, ClusterState, gang_shape, parse_cluster_shape
from tensoryard.sim.engine import (
    Policy,
    SimConfig,
    SimContext,
    SimulationError,
    Simulator,
    simulate,
)
from tensoryard.sim.jobs import JobState, SimJob
from tensoryard.sim.metrics import SimResult
from tensoryard.sim.plot import plot_result
from tensoryard.sim.policies import POLICY_NAMES, make_policy
from tensoryard.sim.quotas import equal_quotas, load_quotas
from tensoryard.sim.run import SimRequest, find_shared_dir, resolve_trace, run_request
from tensoryard.sim.trace import TraceError, TraceJob, load_trace, parse_window, select_window
from tensoryard.sim.view import JobView, OracleAccessError

__all__ = [
    "POLICY_NAMES",
    "ClusterShape",
    "ClusterState",
    "JobState",
    "JobView",
    "OracleAccessError",
    "Policy",
    "SimConfig",
    "SimContext",
    "SimJob",
    "SimRequest",
    "SimResult",
    "SimulationError",
    "Simulator",
    "TraceError",
    "TraceJob",
    "equal_quotas",
    "find_shared_dir",
    "gang_shape",
    "load_quotas",
    "load_trace",
    "make_policy",
    "parse_cluster_shape",
    "parse_window",
    "plot_result",
    "resolve_trace",
    "run_request",
    "select_window",
    "simulate",
]
