"""Reading the TYARD_* / torchrun environment (docs/contracts.md, section 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from tensoryard import envvars
from tensoryard.errors import RuntimeSetupError

__all__ = ["attempt_numbers", "env_float", "env_int", "env_str", "setting"]

T = TypeVar("T")


def env_str(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when it is unset or blank."""
    value = env.get(name, "").strip()
    return value or None


def setting(var: envvars.EnvVar[T], env: Mapping[str, str]) -> T:
    """A variable of the contract with its declared default; a bad value raises
    RuntimeSetupError naming the variable."""
    return var.value(env, error=RuntimeSetupError)


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    """An integer variable; a bad value raises RuntimeSetupError naming the variable."""
    raw = env_str(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise RuntimeSetupError(
            f"{name}={raw!r} is not an integer (fix: set {name} to a whole number >= {minimum})"
        ) from exc
    if value < minimum:
        raise RuntimeSetupError(f"{name}={value} is below {minimum} (fix: set {name} >= {minimum})")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    """A float variable; a bad value raises RuntimeSetupError naming the variable."""
    raw = env_str(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise RuntimeSetupError(
            f"{name}={raw!r} is not a number (fix: set {name} to a number >= {minimum})"
        ) from exc
    if not value >= minimum:  # also rejects NaN
        raise RuntimeSetupError(f"{name}={value} is below {minimum} (fix: set {name} >= {minimum})")
    return value


def attempt_numbers(env: Mapping[str, str]) -> tuple[int, int | None]:
    """(this worker's attempt, the launched attempt when torchrun restarted it in place).

    The local executor's rank wrapper numbers restarted workers itself (TYARD_ATTEMPT already
    launch + k, TYARD_LAUNCH_ATTEMPT set). Elsewhere (a Kubernetes pod's own torchrun) the
    control plane sets TYARD_IN_PLACE_RESTARTS when it granted in-place restarts, and restart k
    (TORCHELASTIC_RESTART_COUNT) of launch L runs as attempt L + k. A plain torchrun run
    without that variable keeps its number across restarts.
    """
    attempt = setting(envvars.ATTEMPT, env)
    if envvars.LAUNCH_ATTEMPT.present(env):
        return attempt, setting(envvars.LAUNCH_ATTEMPT, env)
    restarts = env_int(env, "TORCHELASTIC_RESTART_COUNT", 0)
    if restarts > 0 and setting(envvars.IN_PLACE_RESTARTS, env) > 0:
        return attempt + restarts, attempt
    return attempt, None
