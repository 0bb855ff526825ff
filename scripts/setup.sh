#!/usr/bin/env bash
# Creates .venv and installs dllm-serve with its extras (default: test,bench; scripts/test.sh adds clients).
# Safe to rerun. Usage: bash scripts/setup.sh [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,bench}"
say() { echo "[setup] $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
. .venv/bin/activate
say "updating pip"
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
  say "installing PyTorch's CPU build (no GPU here; about 200 MB, a minute or two)"
  python -m pip install -q "${cpu_index[@]}" torch==2.13.0
fi
say "installing dllm-serve and its dependencies, extras [$extras] (the first time takes a few minutes; quiet meanwhile)"
python -m pip install -q -e ".[$extras]"
say "done: .venv is ready"
