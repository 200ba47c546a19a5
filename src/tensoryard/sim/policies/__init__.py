"""Scheduling policies the simulator can replay, by name (``tyard sim --policy NAME``)."""

from __future__ import annotations

from collections.abc import Callable

from tensoryard.errors import ConfigError
from tensoryard.sim.engine import Policy
from tensoryard.sim.policies.fifo import FifoPolicy
from tensoryard.sim.policies.kueue_like import KueueLikePolicy
from tensoryard.sim.policies.sjf import SjfOraclePolicy
from tensoryard.sim.policies.srtf import SrtfOraclePolicy
from tensoryard.sim.policies.tiresias import LasConfig, TiresiasLasPolicy

__all__ = [
    "POLICY_NAMES",
    "FifoPolicy",
    "KueueLikePolicy",
    "LasConfig",
    "SjfOraclePolicy",
    "SrtfOraclePolicy",
    "TiresiasLasPolicy",
    "make_policy",
]


def _default() -> Policy:
    # Imported lazily: the adapter pulls in the whole scheduling core.
    from tensoryard.sim.policies.default import DefaultPolicy

    return DefaultPolicy()


_FACTORIES: dict[str, Callable[[], Policy]] = {
    "default": _default,
    "fifo": FifoPolicy,
    "sjf-oracle": SjfOraclePolicy,
    "srtf-oracle": SrtfOraclePolicy,
    "tiresias-las": TiresiasLasPolicy,
    "kueue-like": KueueLikePolicy,
}
POLICY_NAMES = tuple(_FACTORIES)


def make_policy(name: str) -> Policy:
    """A fresh policy by name; raises ConfigError listing the known names."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r} (fix: use one of {', '.join(POLICY_NAMES)})"
        ) from None
    return factory()
