"""tensoryard.runtime.gang: the pieces of a Kubernetes gang's in-place restarts (is_host from
NODE_RANK, restart rounds counted per pod), and its errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensoryard.runtime.gang import claim_round, launch_argv, round_env


def test_node_0_hosts_the_rendezvous_store_and_the_others_join_it() -> None:
    argv = ["torchrun", "--nnodes=2", "--rdzv-backend=c10d", "--no-python", "train.py"]
    assert launch_argv(argv, {"NODE_RANK": "0"}) == [
        "torchrun", "--nnodes=2", "--rdzv-conf=is_host=true", *argv[2:]
    ]  # fmt: skip
    python = ["python", "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "x.py"]
    assert launch_argv(python, {"NODE_RANK": "3"})[3:5] == [
        "--rdzv-conf=is_host=false",
        *python[3:4],
    ]


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["torchrun", "--rdzv-backend=c10d", "x"], {}, "NODE_RANK=''"),
        (["torchrun", "--rdzv-backend=c10d", "x"], {"NODE_RANK": "one"}, "NODE_RANK='one'"),
        (["torchrun", "--rdzv-conf=timeout=9", "x"], {"NODE_RANK": "0"}, "--rdzv-conf"),
        (["torchrun", "--master-addr=a", "x"], {"NODE_RANK": "0"}, "--rdzv-backend=c10d"),
    ],
)
def test_launch_refuses_what_would_misplace_the_store(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        launch_argv(argv, env)


def test_each_start_claims_the_next_round(tmp_path: Path) -> None:
    assert [claim_round(tmp_path / "0") for _ in range(3)] == [0, 1, 2]
    assert claim_round(tmp_path / "1") == 0  # another local rank counts its own starts


def test_round_k_of_launch_l_reports_as_attempt_l_plus_k(tmp_path: Path) -> None:
    env = {"TYARD_ATTEMPT": "4", "TYARD_ROUNDS_DIR": str(tmp_path), "LOCAL_RANK": "1"}
    first, second = round_env(env), round_env(env)
    assert first["TYARD_RESTART_ROUND"] == "0" and first["TYARD_ATTEMPT"] == "4"
    assert "TYARD_LAUNCH_ATTEMPT" not in first
    assert (second["TYARD_RESTART_ROUND"], second["TYARD_ATTEMPT"]) == ("1", "5")
    assert second["TYARD_LAUNCH_ATTEMPT"] == "4"


def test_the_command_line_says_how_to_call_it_and_names_a_missing_command() -> None:
    run = [sys.executable, "-m", "tensoryard.runtime.gang"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr
    env = {"NODE_RANK": "0", "PATH": "/nonexistent"}
    missing = [*run, "launch", "--", "no-such-torchrun", "--rdzv-backend=c10d"]
    done = subprocess.run(missing, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 127 and "no-such-torchrun" in done.stderr
    assert "Traceback" not in done.stderr
