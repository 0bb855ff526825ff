#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and serves the OpenAI-compatible API on http://localhost:3000
# with the embedded model. Extra arguments go to `bentoml serve` (e.g. --port 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec bentoml serve service:DiffusionLLMService "$@"
