"""The rank wrapper (executors/local/rank.py) ends like the rank it ran."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_the_wrapper_dies_of_the_signal_its_rank_died_of(sig: signal.Signals) -> None:
    # Found on the H200: a rank killed by SIGKILL made the wrapper raise (SIGKILL's handler
    # cannot be set) and exit 1 with a traceback in the rank log, instead of dying of SIGKILL.
    code = f"from tensoryard.executors.local.rank import _end_like; _end_like(-{int(sig)})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == -int(sig), done.stderr
    assert "Traceback" not in done.stderr


def test_the_wrapper_exits_with_its_ranks_code() -> None:
    code = "from tensoryard.executors.local.rank import _end_like; _end_like(3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 3 and done.stderr == ""
