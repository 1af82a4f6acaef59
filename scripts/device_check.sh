#!/usr/bin/env bash
# The device check (issue 22): LM training speed in bf16 with and without torch.compile, codec
# training steps/s, tokenizing throughput, generation frames/s at batch 1 and 64 and the CUDA tests,
# every figure into one JSON, in under 8 minutes on an H200 (docs/benchmarks.md, "Device check").
#
#   bash scripts/device_check.sh --out device_check.json        # on a GPU
#   bash scripts/device_check.sh --tiny --out /tmp/check.json     # CPU, tiny models, seconds
#
# Needs only the repository and a stock CUDA PyTorch image's packages (torch, torchaudio, lightning,
# einops, safetensors; soundfile and pytest are optional). Python: $PYTHON, else the repository's
# .venv, else python3. Exit status 1 when a section failed (the JSON says which and why).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY="$(command -v python3 || command -v python)"; fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" "$REPO/benchmarks/device_check.py" "$@"
