"""The crash points, where the control plane's code imports them (see tensoryard.faults)."""

from tensoryard.faults import CRASH_ENV, POINTS, SIGNAL_ENV, crashpoint

__all__ = ["CRASH_ENV", "POINTS", "SIGNAL_ENV", "crashpoint"]
