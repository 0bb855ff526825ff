#!/usr/bin/env bash
# Creates .venv and installs dllm-serve with its test extra. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# A plain `torch` requirement pulls a multi-GB CUDA build: take the CPU build on machines without a GPU.
if ! command -v nvidia-smi >/dev/null 2>&1 && ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q torch==2.13.0
fi
python -m pip install -q -e ".[test,bench]"
