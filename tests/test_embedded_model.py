"""The embedded default model (models/tiny-llada-chat) answers held-out prompts, and its split is clean."""

from __future__ import annotations

import pytest

from engine import DiffusionEngine, SamplingParams
from engine.loading import EMBEDDED_MODEL_DIR
from scripts.eval_tiny_model import run as run_heldout
from scripts.tiny_chat_corpus import FAMILIES, heldout_examples, training_pool

# The first two held-out prompts of each family the shipped model answers at >= 97% on the 400-prompt
# evaluation (models/tiny-llada-chat/README.md). Arithmetic (88%) is covered by the batched test only.
LEARNED_FAMILIES = ("compare", "count", "successor", "spell", "facts", "repeat", "name")
CASES = [e for f in LEARNED_FAMILIES for e in [x for x in heldout_examples(400) if x.family == f][:2]]


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    return DiffusionEngine.from_pretrained(device="cpu")  # no argument: the embedded model


def test_embedded_model_is_small_and_in_llada_layout():
    names = {p.name for p in EMBEDDED_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL_DIR.iterdir()) <= 25 * 1024 * 1024


@pytest.mark.parametrize("example", CASES, ids=[e.family for e in CASES])
def test_embedded_model_answers_heldout_prompt(engine, example):
    params = SamplingParams(gen_length=32, block_length=32, num_denoising_steps=32, temperature=0.0)
    res = engine.generate(messages=example.messages, params=params)
    assert res.text.strip() == example.answer
    assert res.finish_reason == "stop"


def test_embedded_model_accuracy_on_the_first_80_heldout_prompts(engine):
    """A broken checkpoint, tokenizer or sampler drops far below this (the card measures 95% on 400)."""
    examples = heldout_examples(80)
    params = SamplingParams(gen_length=32, block_length=32, num_denoising_steps=32, temperature=0.0)
    results = run_heldout(engine, examples, params, batch=40)
    exact = sum(r.text.strip() == e.answer for e, r in zip(examples, results))
    assert exact >= 0.9 * len(examples)
    assert all(r.finish_reason == "stop" for r in results)


def test_heldout_prompts_never_in_training_split():
    train_keys = {e.key for items in training_pool().values() for e in items}
    heldout = heldout_examples(10_000)
    assert len(heldout) >= 350
    assert {e.family for e in heldout} == set(FAMILIES)
    assert not train_keys & {e.key for e in heldout}


def test_heldout_list_is_deterministic():
    assert [e.key for e in heldout_examples(50)] == [e.key for e in heldout_examples(50)]
