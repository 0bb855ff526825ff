#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,bench,clients,quant  # clients: the third-party clients the tests run; quant: torchao
. .venv/bin/activate
# tests/test_playground.py drives the OS's Chromium (Playwright's own browser download is not used). As root on
# Debian (CI) it is installed here; elsewhere those tests are skipped, saying why.
if ! python -c "from scripts.playground_screenshot import find_chromium; exit(find_chromium() is None)"; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (apt-get) for the playground's browser tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "no chromium: the playground's browser tests will be skipped (apt-get install chromium)" >&2
  fi
fi
python -m pytest "$@"
