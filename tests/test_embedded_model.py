"""The embedded default model (models/tiny-llada-chat) answers held-out prompts, and its split is clean.

Besides its task families it must behave for a newcomer: a short reply to small talk, one honest help
answer to anything else, the same task answers behind a system prompt or after an earlier exchange, and
number words as well as digits.
"""

from __future__ import annotations

import pytest

from engine import DiffusionEngine, SamplingParams
from engine.loading import EMBEDDED_MODEL_DIR
from scripts.eval_tiny_model import after_earlier_exchange, evaluation_rows, with_system_prompt
from scripts.eval_tiny_model import run as run_heldout
from scripts.tiny_chat_corpus import (
    FACTS,
    FAMILIES,
    HELP_ANSWER,
    NAMES,
    NUMBER_WORDS,
    WORDS,
    heldout_examples,
    heldout_system_prompts,
    training_pool,
    training_system_prompts,
)

# The first two held-out prompts of each family the shipped model answers at >= 98% on the 400-prompt
# evaluation (models/tiny-llada-chat/README.md). Arithmetic (96%) is covered by the batched test only.
LEARNED_FAMILIES = ("compare", "count", "successor", "spell", "facts", "repeat", "name")
CASES = [e for f in LEARNED_FAMILIES for e in [x for x in heldout_examples(400) if x.family == f][:2]]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


ASSISTANT = {"role": "system", "content": "You are a helpful assistant."}
# The first prompts a newcomer tries (several answered with a stray token by the first embedded model).
NEWCOMER = [
    ([user("Hello")], "Hello! Nice to meet you."),
    ([user("Who are you?")], HELP_ANSWER),
    ([user("Write a haiku about the sea.")], HELP_ANSWER),
    ([user("Count from one to five.")], "1 2 3 4 5"),
    ([ASSISTANT, user("What is 2 plus 5?")], "7"),
    ([ASSISTANT, user("Spell dog.")], "d-o-g"),
]
# The first two held-out prompts of each conversation row of scripts/eval_tiny_model.py.
ROWS = evaluation_rows(400)
CONVERSATIONS = [
    (row, e) for row in ("small talk", "help (other)", "tasks, system prompt", "number words") for e in ROWS[row][:2]
]


@pytest.fixture(scope="module")
def engine(embedded_engine) -> DiffusionEngine:
    return embedded_engine  # `from_pretrained` with no argument: the embedded model (tests/conftest.py)


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


@pytest.mark.slow  # 80 generations
def test_embedded_model_accuracy_on_the_first_80_heldout_prompts(engine):
    """A broken checkpoint, tokenizer or sampler drops far below this (the card measures 99% on 400)."""
    examples = heldout_examples(80)
    params = SamplingParams(gen_length=32, block_length=32, num_denoising_steps=32, temperature=0.0)
    results = run_heldout(engine, examples, params, batch=40)
    exact = sum(r.text.strip() == e.answer for e, r in zip(examples, results))
    assert exact >= 0.9 * len(examples)
    assert all(r.finish_reason == "stop" for r in results)


@pytest.mark.parametrize(("messages", "answer"), NEWCOMER, ids=[m[-1]["content"] for m, _ in NEWCOMER])
def test_embedded_model_answers_a_newcomers_first_prompts(engine, messages, answer):
    res = engine.generate(messages=messages, params=SamplingParams(gen_length=64, temperature=0.0))
    assert (res.text.strip(), res.finish_reason) == (answer, "stop")


@pytest.mark.parametrize(("row", "example"), CONVERSATIONS, ids=[row for row, _ in CONVERSATIONS])
def test_embedded_model_answers_heldout_conversations(engine, row, example):
    """The help answer is 33 tokens: with end of turn it fits the 64-token canvas the model card promises."""
    res = engine.generate(messages=example.messages, params=SamplingParams(gen_length=64, temperature=0.0))
    assert (res.text.strip(), res.finish_reason) == (example.answer, "stop")


def test_evaluation_rows_wrap_the_task_prompts_in_heldout_conversations():
    tasks = heldout_examples(40)
    systems = set(heldout_system_prompts())
    assert all(e.messages[0]["content"] in systems for e in with_system_prompt(tasks))
    for e, task in zip(after_earlier_exchange(tasks), tasks):
        assert e.messages[-len(task.messages) :] == task.messages and e.answer == task.answer
        assert e.messages[-len(task.messages) - 1]["role"] == "assistant"
    # Number-word prompts carry no digit at all (every number of the prompt is spelled out).
    assert len(ROWS["number words"]) >= 20
    assert not any(c.isdigit() for e in ROWS["number words"] for c in e.messages[-1]["content"])


def test_every_task_word_is_one_token(engine):
    """Spelling and copying are learned per token: a word split in pieces could not be spelled."""
    words = {*WORDS, *NAMES, *NUMBER_WORDS, *(w.capitalize() for w in NUMBER_WORDS), *(a for *_, a in FACTS)}
    split = [w for w in sorted(words) for text in (w, " " + w) if len(engine.tokenizer.encode_text(text)) != 1]
    assert not split


def test_heldout_system_prompts_never_in_training():
    assert heldout_system_prompts() and not set(heldout_system_prompts()) & set(training_system_prompts())
    assert ASSISTANT["content"] in training_system_prompts()  # what front-ends send is trained on


def test_heldout_prompts_never_in_training_split():
    train_keys = {e.key for items in training_pool().values() for e in items}
    heldout = heldout_examples(10_000, families=tuple(FAMILIES))
    assert len(heldout) >= 350
    assert {e.family for e in heldout} == set(FAMILIES)
    assert not train_keys & {e.key for e in heldout}


def test_heldout_list_is_deterministic():
    assert [e.key for e in heldout_examples(50)] == [e.key for e in heldout_examples(50)]
