"""One call from a trace name and a cluster shape to a finished replay (CLI and benchmarks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tensoryard import envvars
from tensoryard.errors import ConfigError
from tensoryard.sim.cluster import ClusterShape, parse_cluster_shape
from tensoryard.sim.engine import Policy, SimConfig, simulate
from tensoryard.sim.metrics import SimResult
from tensoryard.sim.policies import make_policy
from tensoryard.sim.quotas import equal_quotas, load_quotas
from tensoryard.sim.trace import TraceJob, load_trace, select_window

__all__ = ["SHARED_TRACES", "SimRequest", "find_shared_dir", "resolve_trace", "run_request"]

SHARED_TRACES = {
    "philly": Path("traces/philly/philly.csv"),
    "tiresias": Path("traces/tiresias/60_job.csv"),
}
_REPO_ROOT = Path(__file__).resolve().parents[3]


def find_shared_dir() -> Path | None:
    """The shared data folder: $TYARD_SHARED_DIR, else ``../shared`` beside the repository."""
    candidates = [
        envvars.SHARED_DIR.get(),
        _REPO_ROOT.parent / "shared",
        Path.cwd().parent / "shared",
    ]
    for path in candidates:
        if path is not None and (path / "traces").is_dir():
            return path
    return None


def resolve_trace(name: str) -> Path:
    """A trace path, or the shortcut ``philly`` / ``tiresias`` for the shared public traces."""
    if name in SHARED_TRACES and not Path(name).exists():
        shared = find_shared_dir()
        if shared is None:
            raise ConfigError(
                f"trace shortcut {name!r} needs the shared traces folder, which was not found "
                "(fix: set TYARD_SHARED_DIR to the folder holding traces/, or give a file path)"
            )
        return shared / SHARED_TRACES[name]
    return Path(name)


@dataclass(frozen=True, kw_only=True)
class SimRequest:
    """Everything a replay needs, as the CLI takes it."""

    trace: str
    cluster: str = "64x8"
    policy: str = "default"
    nodes_per_switch: int | None = None
    quotas: str | None = None
    window: tuple[int, int | None] = (0, None)
    config: SimConfig = field(default_factory=SimConfig)


def prepare(request: SimRequest) -> tuple[list[TraceJob], ClusterShape]:
    """Load and window the trace and parse the cluster shape."""
    jobs = load_trace(resolve_trace(request.trace))
    start, end = request.window
    if (start, end) != (0, None):
        jobs = select_window(jobs, start=start, end=end)
    shape = parse_cluster_shape(request.cluster, nodes_per_switch=request.nodes_per_switch)
    return jobs, shape


def run_request(
    request: SimRequest,
    *,
    policy: Policy | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: list[TraceJob] | None = None,
) -> SimResult:
    """Replay ``request`` (or ``jobs``, when already loaded) and return the result."""
    if jobs is None:
        jobs, shape = prepare(request)
    else:
        shape = parse_cluster_shape(request.cluster, nodes_per_switch=request.nodes_per_switch)
    teams = {j.team for j in jobs}
    if request.quotas:
        quotas = load_quotas(request.quotas, teams, shape.gpu_model)
    else:
        quotas = equal_quotas(teams, shape.total_gpus, shape.gpu_model)
    chosen = policy if policy is not None else make_policy(request.policy)
    return simulate(jobs, shape, chosen, quotas, request.config, progress)
