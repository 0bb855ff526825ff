#!/usr/bin/env bash
# Creates .venv and installs dllm-serve with its test extra. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# A plain `torch` requirement pulls a multi-GB CUDA build: take the CPU build on machines without a GPU.
# PyPI's Linux wheels are CUDA builds; PyTorch's own CPU index has the CPU ones (`2.13.0+cpu` sorts above
# `2.13.0`, so pip takes it). Machines that cannot reach that index (this project's CI VMs) get the CPU
# build from their own pip configuration; probing first spares them pip's retries.
if ! command -v nvidia-smi >/dev/null 2>&1 && ! python -c "import torch" 2>/dev/null; then
  cpu_index=()
  if python -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    cpu_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  python -m pip install -q "${cpu_index[@]}" torch==2.13.0
fi
python -m pip install -q -e ".[test,bench]"
