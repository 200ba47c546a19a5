"""Pipelines: DAGs of jobs (pretrain, fine-tune, evaluate; register once the registry lands).

The spec language is in `tensoryard.spec.pipeline`, the rows in the store, the advancer that
runs them in the control loop in `tensoryard.server.pipelines`; this package holds what a
step leaves for later steps (`outputs`).
"""

from tensoryard.pipelines.outputs import OUTPUTS_FILE, check_outputs, read_outputs_file

__all__ = ["OUTPUTS_FILE", "check_outputs", "read_outputs_file"]
