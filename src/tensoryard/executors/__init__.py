"""Executors: one protocol, several implementations (local processes today)."""

from tensoryard.executors.base import AttemptPhase, AttemptStatus, Executor, LaunchRequest

__all__ = ["AttemptPhase", "AttemptStatus", "Executor", "LaunchRequest"]
