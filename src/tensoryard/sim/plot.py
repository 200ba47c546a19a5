"""A PNG of one replay: queue length and GPU allocation over time (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from tensoryard.errors import ConfigError
from tensoryard.sim.metrics import SimResult

__all__ = ["plot_result"]

_MAX_POINTS = 4000


def _thin(values: list[float], step: int) -> list[float]:
    return values[::step] if step > 1 else values


def plot_result(result: SimResult, path: str | Path) -> Path:
    """Write the plot of ``result`` to ``path`` and return the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an optional extra
        raise ConfigError("plots need matplotlib (fix: pip install 'tensoryard[plot]')") from exc
    series = result.recorder.series
    step = max(1, len(series.time_s) // _MAX_POINTS)
    hours = [t / 3600 for t in _thin(series.time_s, step)]
    total = result.total_gpus
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.step(hours, _thin([float(v) for v in series.pending_jobs], step), where="post")
    top.set_ylabel("pending jobs")
    top.set_title(f"policy {result.policy}: queue length and GPU allocation")
    allocated = _thin([float(v) for v in series.allocated_gpus], step)
    wanted = _thin([float(min(v, total)) for v in series.demand_gpus], step)
    bottom.step(hours, wanted, where="post", label="demand (capped at cluster)", alpha=0.6)
    bottom.step(hours, allocated, where="post", label="allocated GPUs")
    bottom.axhline(total, color="grey", linestyle=":", label=f"cluster ({total} GPUs)")
    bottom.set_ylabel("GPUs")
    bottom.set_xlabel("simulated hours")
    bottom.legend(loc="lower right")
    fig.tight_layout()
    out = Path(path)
    try:
        fig.savefig(out, dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write plot {out}: {exc.strerror} (check the path)") from exc
    finally:
        plt.close(fig)
    return out
