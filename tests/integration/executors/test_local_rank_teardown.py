"""The rank wrapper and a crash in torch's C++ teardown after training ended cleanly (torch
2.13 + gloo once aborted a finished rank at exit: "terminate called without an active
exception"): with the runtime's done marker the rank counts as a success, without it the
crash is the rank's exit, as before. Real processes, the real wrapper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tensoryard.executors.local.plan import RANK_WRAPPER

SCRIPT = """\
import os, sys
if sys.argv[1] == "done":
    open(os.environ["TYARD_RANK_DONE_FILE"], "w").write("done\\n")  # what Session.close does
os.abort()  # stands in for std::terminate in a destructor at interpreter exit
"""


@pytest.mark.parametrize(("mode", "code"), [("done", 0), ("crash", -signal.SIGABRT)])
def test_a_crash_after_the_done_marker_is_a_success_and_before_it_a_failure(
    tmp_path: Path, mode: str, code: int
) -> None:
    script = tmp_path / "rank_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "RANK": "1"}
    ran = subprocess.run(
        [sys.executable, str(RANK_WRAPPER), str(tmp_path), str(script), mode],
        env=env,
        timeout=60,
    )
    assert ran.returncode == code
    record = json.loads((tmp_path / "rank-1.exit.json").read_text())
    assert record["exit_code"] == code
    log = (tmp_path / "rank-1.log").read_text()
    assert ("finished cleanly" in log and "SIGABRT" in log) is (mode == "done")
