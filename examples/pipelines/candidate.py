"""Record the model a `register` step would register (the registry is not built yet).

Reads TYARD_INPUT_CHECKPOINT and TYARD_INPUT_PERPLEXITY (the step's `inputs`) and writes them
to $TYARD_RUN_DIR/outputs.json, so the pipeline shows the candidate among its outputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    try:
        checkpoint = os.environ["TYARD_INPUT_CHECKPOINT"]
        perplexity = float(os.environ["TYARD_INPUT_PERPLEXITY"])
    except (KeyError, ValueError) as exc:
        print(f"error: the step's inputs are missing or not numbers: {exc}", file=sys.stderr)
        return 2
    if not Path(checkpoint).is_dir():
        print(f"error: checkpoint {checkpoint} does not exist", file=sys.stderr)
        return 2
    result = {"candidate_checkpoint": checkpoint, "candidate_perplexity": perplexity}
    out = Path(os.environ.get("TYARD_RUN_DIR", ".")) / "outputs.json"
    out.write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(
        f"candidate: {checkpoint} (perplexity {perplexity:.3f}); registering it needs the "
        "model registry, which is not built yet"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
