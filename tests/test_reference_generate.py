"""The sampler against the official LLaDA generate() (temperature 0, uniform, top1_prob)."""

import pytest

from engine import SamplingParams
from tests.fixture_paths import reference


def reference_params(case, **overrides):
    return SamplingParams(
        gen_length=case["gen_length"],
        block_length=case["block_length"],
        num_denoising_steps=case["steps"],
        **overrides,
    )


def expected_tokens(case):
    first_stop = case["first_eos_or_eot_index"]
    return case["output_ids"] if first_stop is None or first_stop < 0 else case["output_ids"][:first_stop]


CASES = reference()["generate_cases"]
CASE_IDS = [f"gen{c['gen_length']}-block{c['block_length']}-steps{c['steps']}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_chat_prompt_tokenizes_like_the_official_template(fixture_engine, case):
    assert fixture_engine.tokenizer.encode_chat(case["messages"]) == case["prompt_ids"]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_reproduces_official_generate_token_for_token(fixture_engine, case):
    result = fixture_engine.generate(messages=case["messages"], params=reference_params(case, early_exit=False))
    assert result.canvas_ids == case["output_ids"]
    assert [sorted(s) for s in result.step_commits] == [sorted(s) for s in case["step_commits"]]
    assert result.num_forward_passes == case["nfe"]
    assert result.token_ids == expected_tokens(case)
    assert result.text == case["text_skip_special"]
    assert result.finish_reason == ("length" if expected_tokens(case) == case["output_ids"] else "stop")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_early_exit_is_lossless(fixture_engine, case):
    full = fixture_engine.generate(messages=case["messages"], params=reference_params(case, early_exit=False))
    early = fixture_engine.generate(messages=case["messages"], params=reference_params(case, early_exit=True))
    assert early.token_ids == full.token_ids
    assert early.text == full.text
    assert early.finish_reason == full.finish_reason
    assert early.num_forward_passes <= full.num_forward_passes


def test_early_exit_saves_forward_passes_somewhere(fixture_engine):
    saved = [
        fixture_engine.generate(messages=c["messages"], params=reference_params(c)).num_forward_passes < c["nfe"]
        for c in CASES
    ]
    assert any(saved)


@pytest.mark.parametrize("case", reference()["batched_generate_cases"], ids=lambda c: f"batch{len(c['prompt_ids'])}")
def test_batched_reference_rows_reproduced_in_one_shared_forward(fixture_engine, case):
    params = reference_params(case, early_exit=False)
    requests = [fixture_engine.new_request(prompt_token_ids=ids, params=params) for ids in case["prompt_ids"]]
    while not all(r.finished for r in requests):
        active = [r for r in requests if not r.finished]
        for event in fixture_engine.step(active):
            assert not isinstance(event, Exception)
    for request, expected in zip(requests, case["output_ids"]):
        assert request.result.canvas_ids == expected


def test_stream_deltas_concatenate_to_the_final_text(fixture_engine):
    case = CASES[0]
    events = list(fixture_engine.stream(messages=case["messages"], params=reference_params(case)))
    assert [e.step for e in events] == list(range(len(events)))
    assert events[-1].finished and not any(e.finished for e in events[:-1])
    assert "".join(e.text_delta for e in events) == events[-1].result.text == case["text_skip_special"]
    remaining = [e.masked_remaining for e in events]
    assert remaining == sorted(remaining, reverse=True)
    committed = sorted(pos for e in events for pos, _ in e.committed)
    assert committed == sorted(set(committed))  # a position is committed once, never changed
