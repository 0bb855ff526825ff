"""Paths the tests use (all inside the repository: no downloads)."""

import json
from functools import cache
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
FIXTURE_DIR = TESTS_DIR / "fixtures" / "llada-tiny"
DREAM_FIXTURE_DIR = TESTS_DIR / "fixtures" / "dream-tiny"
LLADA2_CHAT_FIXTURE_DIR = TESTS_DIR / "fixtures" / "llada2-chat-tiny"
EMBEDDED_MODEL_DIR = REPO_ROOT / "models" / "tiny-llada-chat"
FAST_DLLM_DIR = TESTS_DIR / "fixtures" / "fast-dllm"
FAST_DLLM_DREAM_DIR = TESTS_DIR / "fixtures" / "fast-dllm-dream"
LLADA2_FIXTURE_DIR = TESTS_DIR / "fixtures" / "llada2-tiny"


@cache
def reference() -> dict:
    """Official LLaDA logits and generate() outputs for the fixture checkpoint."""
    return json.loads((FIXTURE_DIR / "reference.json").read_text())


@cache
def fast_dllm_reference() -> dict:
    """Official Fast-dLLM sampler runs (no cache, prefix cache, dual cache) on the same fixture checkpoint."""
    return json.loads((FAST_DLLM_DIR / "reference-a.json").read_text())


@cache
def fast_dllm_dream_reference() -> dict:
    """Official Fast-dLLM Dream sampler runs (prefix / dual cache, quota / threshold) on the Dream fixture."""
    return json.loads((FAST_DLLM_DREAM_DIR / "reference-a.json").read_text())


@cache
def dream_reference() -> dict:
    """Official Dream logits, diffusion_generate() outputs and chat prompts for the Dream fixture."""
    return json.loads((DREAM_FIXTURE_DIR / "reference.json").read_text())


@cache
def llada2_cases() -> dict:
    """Official LLaDA2.0 / 2.1 generate() runs on the llada2-tiny checkpoint (its README, section 6)."""
    return json.loads((LLADA2_FIXTURE_DIR / "cases.json").read_text())
