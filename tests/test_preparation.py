"""Cheap checks before expensive work: the prompt-length bound that refuses without tokenizing, and the
bounded two-lane preparation stage (engine/preparation.py), on both model families' fixtures.

Where a test must hold the preparation stage still, it gates the tokenizer; time bounds only turn a hang
into a failure.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import engine.preparation as preparation
from engine import DiffusionEngine, EngineOverloaded, InvalidParameter, Prompt, SamplingParams, SchedulerConfig
from engine.tokenizer import _normalizer_shrink

HANG_GUARD_S = 60
PARAMS = SamplingParams(gen_length=16, num_denoising_steps=8)


def fresh(base: DiffusionEngine, **config) -> DiffusionEngine:
    return DiffusionEngine(base.model, base.tokenizer, base.device, base.model_name, SchedulerConfig(**config))


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, HANG_GUARD_S))


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.fixture(params=["llada", "dream"])
def any_engine(request, fixture_engine, dream_engine) -> DiffusionEngine:
    return fixture_engine if request.param == "llada" else dream_engine


# --- the length bound ----------------------------------------------------------------------------------


def adversarial_texts(tokenizer) -> list[str]:
    """Texts that pack the most characters into the fewest tokens: the vocabulary's longest tokens
    repeated, long whitespace runs, and characters that normalizers compose or tokenizers split."""
    hf = tokenizer.hf
    added = {token.content for token in hf.added_tokens_decoder.values()}  # user text splits these
    longest = sorted((t for t in hf.get_vocab() if t not in added), key=len, reverse=True)[:20]
    texts = [hf.convert_tokens_to_string([token]) * 400 for token in longest]
    texts += [" " * 3000, "\n" * 3000, "\t \n" * 500, "a " * 1500, "a" * 3000, "ab" * 1500]
    texts += ["e\u0301" * 500, "\u1100\u1161\u11a8" * 300, "\u03b1\u0314\u0301\u0345" * 200]  # NFC composes
    texts += ["日本語のテキスト" * 200, "🙂" * 500, "<|mdm_mask|><|im_end|>" * 100]
    return texts


def test_a_token_never_stands_for_more_characters_than_the_bound_says(any_engine):
    """The invariant the cheap refusal rests on: tokens × max_chars_per_token ≥ the characters tokenized,
    so a prompt refused for its length could never have fitted."""
    tokenizer = any_engine.tokenizer
    assert tokenizer.max_chars_per_token is not None
    for text in adversarial_texts(tokenizer):
        tokens = len(tokenizer.encode_chat(user(text)))
        assert tokens * tokenizer.max_chars_per_token >= tokenizer.content_chars(text), text[:40]


def test_normalizers_that_can_delete_text_give_no_bound():
    assert _normalizer_shrink(None) == 1
    assert _normalizer_shrink({"type": "NFC"}) == 4
    assert _normalizer_shrink({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "NFD"}]}) == 4
    assert _normalizer_shrink({"type": "Strip", "strip_left": True, "strip_right": True}) is None
    assert _normalizer_shrink({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace"}]}) is None


def test_a_prompt_too_long_to_fit_is_refused_without_tokenizing(any_engine, monkeypatch):
    engine = fresh(any_engine)
    room = min(engine.max_sequence_length - PARAMS.gen_length, engine.max_prompt_tokens)
    overhead = engine.tokenizer.message_overhead  # one message: its template tokens and text count too
    limit = (room - overhead.special_tokens) * engine.tokenizer.max_chars_per_token - overhead.chars

    def must_not_tokenize(messages):
        raise AssertionError("tokenized a prompt that its length alone rules out")

    monkeypatch.setattr(engine.tokenizer, "encode_chat", must_not_tokenize)
    with pytest.raises(InvalidParameter) as refused:
        engine.check_prompt_size(Prompt.chat(user("x" * (limit + 1))), PARAMS)
    assert refused.value.field == "messages" and f" {room} " in refused.value.rule
    at_the_bound = Prompt.chat(user("x" * limit))
    engine.check_prompt_size(at_the_bound, PARAMS)  # not refused: left to the tokenizer

    async def through_astream():
        with pytest.raises(InvalidParameter):
            await engine.agenerate(messages=user("x" * (limit + 1)), params=PARAMS)

    run(through_astream())
    assert engine.stats.snapshot()["dllm_requests_preparing"] == 0


def test_a_trimming_template_counts_only_what_it_keeps(fixture_engine):
    """LLaDA's template strips the content: a megabyte of spaces around a word is a short prompt."""
    engine = fresh(fixture_engine)
    padded = " " * 1_000_000 + "hi" + "\n" * 1_000_000
    assert engine.check_prompt_size(Prompt.chat(user(padded)), PARAMS) == engine.check_prompt_size(
        Prompt.chat(user("hi")), PARAMS
    )
    assert (
        engine.generate(messages=user(padded), params=PARAMS).text
        == engine.generate(messages=user("hi"), params=PARAMS).text
    )


def test_token_ids_are_bounded_by_their_count(fixture_engine):
    engine = fresh(fixture_engine)
    room = engine.max_sequence_length - PARAMS.gen_length
    with pytest.raises(InvalidParameter) as refused:
        engine.check_prompt_size(Prompt.token_ids([5] * (room + 1)), PARAMS)
    assert refused.value.field == "gen_length"
    assert engine.check_prompt_size(Prompt.token_ids([5] * room), PARAMS) == room


# --- the preparation stage ------------------------------------------------------------------------------


class GatedTokenizer:
    """Wraps encode_chat: prompts whose content starts with `prefix` wait at a gate (the tokenizer is busy)."""

    def __init__(self, engine: DiffusionEngine, monkeypatch, prefix: str):
        self.real = engine.tokenizer.encode_chat
        self.prefix = prefix
        self.gate = threading.Event()
        self.entered = threading.Event()
        monkeypatch.setattr(engine.tokenizer, "encode_chat", self)

    def __call__(self, messages):
        if messages[0]["content"].startswith(self.prefix):
            self.entered.set()
            assert self.gate.wait(HANG_GUARD_S)
        return self.real(messages)


def test_a_short_prompt_is_not_delayed_by_a_long_one_being_tokenized(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine)
    monkeypatch.setattr(preparation, "LONG_PROMPT_CHARS", 120)  # "hi" is short, "long word…" long
    gated = GatedTokenizer(engine, monkeypatch, prefix="long")

    async def scenario():
        long = asyncio.ensure_future(engine.agenerate(messages=user("long " + "word " * 20), params=PARAMS))
        await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, HANG_GUARD_S)
        assert engine.stats.snapshot()["dllm_requests_preparing"] == 1
        short = await engine.agenerate(messages=user("hi"), params=PARAMS)  # completes while the long one waits
        assert not long.done()
        gated.gate.set()
        return short, await long

    short, long = run(scenario())
    engine.shutdown()
    assert short.text == fixture_engine.generate(messages=user("hi"), params=PARAMS).text
    assert long.num_forward_passes > 0


def test_requests_being_prepared_count_against_the_capacity(fixture_engine, monkeypatch):
    """Capacity 3: one request running, two being prepared; the next is refused although the stage itself
    (3 places) still has room."""
    engine = fresh(fixture_engine, max_batch_size=2, max_waiting=1)
    gated = GatedTokenizer(engine, monkeypatch, prefix="held")
    stepping = threading.Event()
    real_step = engine.step

    def gated_step(requests):
        assert stepping.wait(HANG_GUARD_S)
        return real_step(requests)

    monkeypatch.setattr(engine, "step", gated_step)

    async def scenario():
        running = asyncio.ensure_future(engine.agenerate(messages=user("hi"), params=PARAMS))
        while engine.stats.snapshot()["dllm_requests_running"] < 1:
            await asyncio.sleep(0.005)
        held = [asyncio.ensure_future(engine.agenerate(messages=user(f"held {i}"), params=PARAMS)) for i in range(2)]
        await asyncio.sleep(0)  # both admitted to the stage (the second queues behind the first's thread)
        assert engine.stats.snapshot()["dllm_requests_preparing"] == 2
        with pytest.raises(EngineOverloaded, match="1 requests running, 0 waiting, 2 being prepared"):
            await engine.agenerate(messages=user("hi"), params=PARAMS)
        gated.gate.set()
        stepping.set()
        return await asyncio.gather(running, *held)

    results = run(scenario())
    engine.shutdown()
    assert len(results) == 3
    stats = engine.stats.snapshot()
    assert stats["dllm_requests_overloaded_total"] == 1 and stats["dllm_requests_total"] == 3
    assert stats["dllm_requests_preparing"] == 0


def test_long_prompts_may_take_only_their_share_of_the_stage(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine, max_preparing=8)  # the long lane: 8 // 8 = 1 place
    monkeypatch.setattr(preparation, "LONG_PROMPT_CHARS", 120)  # "hi" is short, "long word…" long
    gated = GatedTokenizer(engine, monkeypatch, prefix="long")
    long_prompt = user("long " + "word " * 20)

    async def scenario():
        first = asyncio.ensure_future(engine.agenerate(messages=long_prompt, params=PARAMS))
        await asyncio.sleep(0)
        with pytest.raises(EngineOverloaded):
            await engine.agenerate(messages=long_prompt, params=PARAMS)
        short = await engine.agenerate(messages=user("hi"), params=PARAMS)  # short prompts still have room
        gated.gate.set()
        return short, await first

    short, first = run(scenario())
    engine.shutdown()
    assert short.num_forward_passes > 0 and first.num_forward_passes > 0
    assert engine.stats.snapshot()["dllm_requests_overloaded_total"] == 1


def test_a_caller_that_leaves_during_preparation_frees_its_place(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine, max_batch_size=2, max_waiting=0)
    gated = GatedTokenizer(engine, monkeypatch, prefix="held")

    async def scenario():
        first = asyncio.ensure_future(engine.agenerate(messages=user("held 1"), params=PARAMS))
        queued = asyncio.ensure_future(engine.agenerate(messages=user("queued"), params=PARAMS))
        await asyncio.sleep(0)
        assert engine.stats.snapshot()["dllm_requests_preparing"] == 2
        queued.cancel()  # not started on its thread yet: dropped, its place freed at once
        assert isinstance((await asyncio.gather(queued, return_exceptions=True))[0], asyncio.CancelledError)
        assert engine.stats.snapshot()["dllm_requests_preparing"] == 1
        gated.gate.set()
        return await first

    assert run(scenario()).num_forward_passes > 0
    engine.shutdown()
    assert engine.stats.snapshot()["dllm_requests_preparing"] == 0
