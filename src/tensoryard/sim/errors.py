"""Errors of the simulator (both are TensoryardError, the package's one root)."""

from __future__ import annotations

from tensoryard.errors import TensoryardError

__all__ = ["OracleAccessError", "SimulationError"]


class SimulationError(TensoryardError):
    """The replay cannot go on (a job can never run, or a policy broke an invariant)."""


class OracleAccessError(SimulationError):
    """A policy read a job's true duration without being declared an oracle."""
