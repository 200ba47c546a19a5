"""Fixtures for real-process tests of the local executor."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from localexec_helpers import Launch

from tensoryard.executors.base import LaunchRequest
from tensoryard.executors.local import LocalExecutor, LocalHandle
from tensoryard.executors.local.procs import is_alive, kill_all, marked_processes
from tensoryard.spec.job import parse_job_spec


@pytest.fixture
def executor() -> LocalExecutor:
    return LocalExecutor()


@pytest.fixture
def launch(executor: LocalExecutor, tmp_path: Path) -> Iterator[Launch]:
    """launch(script_source, launcher=..., procs=..., env=...) -> handle; cleans up after."""
    handles: list[dict[str, Any]] = []
    counter = iter(range(1, 1000))

    def _launch(
        source: str, *, launcher: str = "python", procs: int = 1, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        n = next(counter)
        script = tmp_path / f"job{n}.py"
        script.write_text(textwrap.dedent(source))
        spec = parse_job_spec(
            {
                "name": "itest",
                "launcher": launcher,
                "command": [script.name],
                "workdir": str(tmp_path),
                "resources": {"processes_per_node": procs},
                "env": {"WORK": str(tmp_path), **(env or {})},
            }
        )
        req = LaunchRequest(job_id=str(n), attempt=1, spec=spec, run_dir=tmp_path / f"run{n}")
        handle = executor.launch(req)
        handles.append(handle)
        return handle

    yield _launch
    for handle in handles:  # a failing test must not leave processes behind
        h = LocalHandle.from_dict(handle)
        shim = [psutil.Process(h.shim_pid)] if is_alive(h.shim_pid, h.shim_create_time) else []
        kill_all(marked_processes(h.attempt_key) + shim)
