"""Paths of the checkpoints the tests run on (all inside the repository: no downloads)."""

import json
from functools import cache
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
FIXTURE_DIR = TESTS_DIR / "fixtures" / "llada-tiny"
EMBEDDED_MODEL_DIR = TESTS_DIR.parent / "models" / "tiny-llada-chat"


@cache
def reference() -> dict:
    """Official LLaDA logits and generate() outputs for the fixture checkpoint."""
    return json.loads((FIXTURE_DIR / "reference.json").read_text())
