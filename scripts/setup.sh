#!/usr/bin/env bash
# Creates .venv and installs dllm-serve with its extras (default: test,bench; scripts/test.sh adds clients).
# Safe to rerun; a rerun for the same pyproject.toml and extras (or fewer) skips pip (the stamp below), so a
# second `bash scripts/serve.sh` starts in seconds. Usage: bash scripts/setup.sh [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,bench}"
say() { echo "[setup] $*" >&2; }
stamp=.venv/.dllm-setup-stamp

# What an install depends on: pyproject.toml (dependencies and extras) and this script. The stamp holds its hash
# and the extras installed with it; a request is satisfied when the hash matches and its extras are among them.
install_hash() { cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1; }
already_installed() {
  [ -x .venv/bin/python ] && [ -f "$stamp" ] || return 1
  local hash installed wanted
  { read -r hash; read -r installed; } <"$stamp" || return 1
  [ "$hash" = "$(install_hash)" ] || return 1
  for wanted in ${extras//,/ }; do
    case ",$installed," in *",$wanted,"*) ;; *) return 1 ;; esac
  done
  # The editable install itself must still be there (a stamp outlives a `pip uninstall`).
  .venv/bin/python -c "import importlib.metadata as m; m.version('dllm-serve')" 2>/dev/null
}
if already_installed; then
  say ".venv is ready (installed for this pyproject.toml with extras [$(sed -n 2p "$stamp")]); pip skipped"
  exit 0
fi

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
# Extras installed earlier for the same pyproject.toml are still there: the stamp keeps them.
previous=""
if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$(install_hash)" ]; then previous="$(sed -n 2p "$stamp"),"; fi
printf '%s\n%s\n' "$(install_hash)" "$(echo "$previous$extras" | tr ',' '\n' | sort -u | paste -sd, -)" >"$stamp"
say "done: .venv is ready"
