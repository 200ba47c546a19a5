#!/usr/bin/env bash
# Run `tyard cluster preflight` for real on a GPU machine (the same command ran on a single-H200
# machine on 2026-12-04 inside scripts/gpu-checks). Prints the JSON report and exits with the
# preflight's exit code.
#
#   scripts/preflight-gpu.sh [INVENTORY NODE]      # with an inventory: checks expectations too
#
# Needs: nvidia-smi, torch with CUDA in the Python below; ibstat only where IB is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-.}"
args=(cluster preflight --json --size-mb "${SIZE_MB:-256}")
if [[ $# -ge 2 ]]; then
  args+=(--inventory "$1" --node "$2")
fi
nvidia-smi -L || true
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m tensoryard.cli.main "${args[@]}" \
  | tee "$OUT/preflight-report.json"
