"""The sampler on a Dream model against the official `diffusion_generate()` (temperature 0).

In scope (issue 18): every recorded case whose `alg` ranks positions by confidence (`maskgit_plus` →
top1_prob, `topk_margin` → margin, `entropy` → entropy_inverse) with no top_p/top_k. `origin` draws its
positions at random and top_p/top_k stay rejected (ADR 005). Each case runs with the model's default
schedule, so these tests also pin that a Dream model defaults to the "dream" schedule.
"""

import asyncio
import json
import shutil

import pytest

from engine import DiffusionEngine, SamplingParams, SchedulerConfig
from engine.schedules import block_quotas
from tests.fixture_paths import DREAM_FIXTURE_DIR, dream_reference

METRIC_OF_ALG = {"maskgit_plus": "top1_prob", "topk_margin": "margin", "entropy": "entropy_inverse"}
EOS, IM_END, MASK = 656, 658, 679


def in_scope(case: dict) -> bool:
    return case["alg"] in METRIC_OF_ALG and case["top_p"] is None and case["top_k"] is None


CASES = [c for c in dream_reference()["generate_cases"] if in_scope(c)]
CASE_IDS = [f"{c['id']}-{c['alg']}-gen{c['max_new_tokens']}-steps{c['steps']}" for c in CASES]
BATCHED = dream_reference()["batched_generate_cases"]


@pytest.fixture
def engine(dream_engine):
    return dream_engine


def dream_params(case: dict, **overrides) -> SamplingParams:
    """The case's settings; block_schedule is left to the model (Dream's default is "dream")."""
    return SamplingParams(
        gen_length=case["max_new_tokens"],
        num_denoising_steps=case["steps"],
        confidence_metric=METRIC_OF_ALG[case["alg"]],
        **overrides,
    )


def until_first_stop(ids: list[int]) -> list[int]:
    stops = [i for i, token in enumerate(ids) if token in (EOS, IM_END)]
    return ids[: stops[0]] if stops else ids


def test_the_scope_is_every_deterministic_confidence_case():
    assert len(CASES) == 27 and {c["alg"] for c in CASES} == set(METRIC_OF_ALG)
    assert {(c["max_new_tokens"], c["steps"]) for c in CASES} == {(n, n // d) for n in (16, 32, 64) for d in (1, 2, 4)}


@pytest.mark.parametrize("prompt", dream_reference()["prompts"], ids=lambda p: p["messages"][-1]["content"][:24])
def test_chat_prompt_from_messages_tokenizes_like_the_official_template(engine, prompt):
    assert engine.tokenizer.encode_chat(prompt["messages"]) == prompt["prompt_ids"]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_reproduces_official_diffusion_generate_token_for_token(engine, case):
    result = engine.generate(messages=case["messages"], params=dream_params(case, early_exit=False))
    assert result.canvas_ids == case["output_ids"]
    assert result.step_commits == case["step_commits"]  # both list a step's offsets in ascending order
    assert result.num_forward_passes == case["nfe"] == case["steps"]
    assert result.token_ids == until_first_stop(case["output_ids"])
    assert result.text == engine.tokenizer.decode(result.token_ids)
    assert result.finish_reason == ("length" if result.token_ids == case["output_ids"] else "stop")
    assert (result.params.block_schedule, result.params.confidence_metric) == ("dream", METRIC_OF_ALG[case["alg"]])


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_early_exit_is_lossless(engine, case):
    full = engine.generate(messages=case["messages"], params=dream_params(case, early_exit=False))
    early = engine.generate(messages=case["messages"], params=dream_params(case))
    assert (early.token_ids, early.text, early.finish_reason) == (full.token_ids, full.text, full.finish_reason)
    assert early.num_forward_passes <= full.num_forward_passes


def test_early_exit_saves_forward_passes_where_an_answer_ends_early(engine):
    ended = [c for c in CASES if c["first_eos_index"] is not None or c["first_im_end_index"] is not None]
    assert ended  # g06 ends at an <|im_end|>, g09 and g16 at <|endoftext|>
    passes = [engine.generate(messages=c["messages"], params=dream_params(c)).num_forward_passes for c in ended]
    assert any(n < c["nfe"] for n, c in zip(passes, ended))


def test_dream_schedule_matches_every_recorded_transfer_count():
    """The schedule alone, including the cases whose tokens are out of scope (top_p/top_k change which
    positions win, not how many)."""
    recorded = [c for c in dream_reference()["generate_cases"] if c["alg"] != "origin"]
    recorded += [dict(row, max_new_tokens=b["max_new_tokens"], steps=b["steps"]) for b in BATCHED for row in b["rows"]]
    assert len(recorded) == 27 + 6 + 7  # in scope, top_p/top_k, batched rows
    for case in recorded:
        quotas = block_quotas("dream", case["max_new_tokens"], case["steps"])
        assert quotas == case["transfer_counts"], case.get("id")


def test_the_schedule_s_eps_comes_from_generation_config(tmp_path):
    shutil.copytree(DREAM_FIXTURE_DIR, tmp_path / "m")
    generation_file = tmp_path / "m" / "generation_config.json"
    generation_file.write_text(json.dumps({**json.loads(generation_file.read_text()), "eps": 0.2}))
    engine = DiffusionEngine.from_pretrained(tmp_path / "m", device="cpu")
    params = SamplingParams(gen_length=32, num_denoising_steps=8, early_exit=False)
    result = engine.generate(prompt_token_ids=[5, 6, 7], params=params)
    assert [len(step) for step in result.step_commits] == block_quotas("dream", 32, 8, 0.2)
    assert block_quotas("dream", 32, 8, 0.2) != block_quotas("dream", 32, 8)  # the eps makes a difference


@pytest.mark.parametrize("case", BATCHED, ids=[b["id"] for b in BATCHED])
def test_batched_reference_rows_reproduced_in_one_shared_forward(engine, case):
    """The official left-padded batches, rebuilt by the engine's own batching (pads are <|endoftext|>)."""
    params = dream_params(case, early_exit=False)
    rows = zip(case["input_ids"], case["attention_mask"])
    prompts = [[token for token, real in zip(ids, mask) if real] for ids, mask in rows]
    assert len({len(p) for p in prompts}) > 1  # really padded
    requests = [engine.new_request(prompt_token_ids=prompt, params=params) for prompt in prompts]
    while not all(r.finished for r in requests):
        for event in engine.step([r for r in requests if not r.finished]):
            assert not isinstance(event, Exception)
    for request, row in zip(requests, case["rows"]):
        assert request.result.canvas_ids == row["output_ids"]
        assert request.result.step_commits == row["step_commits"]
        assert request.result.num_forward_passes == case["nfe"]


# --- beyond the official sampler: the engine's own features on a Dream model ---------------------------

MIXED = [  # prompt index, settings: lengths, blocks, schedules, metrics, LocalLeap and sampling all differ
    (0, dict(gen_length=16, num_denoising_steps=8, confidence_metric="margin")),
    (4, dict(gen_length=32, block_length=8, num_denoising_steps=16, block_schedule="uniform")),
    (5, dict(gen_length=24, num_denoising_steps=24)),
    (7, dict(gen_length=32, num_denoising_steps=16, use_local_leap=True, local_leap_anchor_threshold=0.3)),
    (2, dict(gen_length=16, num_denoising_steps=16, temperature=0.8, seed=5, confidence_metric="top1_prob")),
]


def mixed_requests(engine):
    prompts = dream_reference()["prompts"]
    return [(prompts[i]["messages"], SamplingParams(early_exit=False, **settings)) for i, settings in MIXED]


def test_a_dream_request_batched_with_others_gives_the_tokens_it_gets_alone(engine):
    alone = [engine.generate(messages=m, params=p) for m, p in mixed_requests(engine)]
    requests = [engine.new_request(messages=m, params=p) for m, p in mixed_requests(engine)]
    while not all(r.finished for r in requests):
        for event in engine.step([r for r in requests if not r.finished]):
            assert not isinstance(event, Exception)
    for solo, request in zip(alone, requests):
        assert request.result.canvas_ids == solo.canvas_ids
        assert request.result.step_commits == solo.step_commits


def test_concurrent_dream_requests_through_the_scheduler_match_their_solo_runs(dream_engine):
    dream = dream_engine
    # The requests start together: the scheduler waits for all of them (a short wait could expire on a loaded
    # machine before the last one is queued, and no forward would be shared).
    burst = SchedulerConfig(max_batch_size=len(MIXED), max_wait_ms=10_000)
    # The session's Dream model and tokenizer, with a scheduler of its own.
    engine = DiffusionEngine(dream.model, dream.tokenizer, dream.device, dream.model_name, burst)
    try:
        # Solo runs on the session's engine: this one's scheduler would wait for a burst at every lone request.
        alone = [dream.generate(messages=m, params=p) for m, p in mixed_requests(engine)]

        async def together():
            return await asyncio.gather(*(engine.agenerate(messages=m, params=p) for m, p in mixed_requests(engine)))

        batched = asyncio.run(together())
        batch_sizes = engine.stats.snapshot()["dllm_batch_size"]
        assert batch_sizes["count"] > batch_sizes["buckets"]["1"], "no forward was shared by two requests"
    finally:
        engine.shutdown()
    assert [r.canvas_ids for r in batched] == [r.canvas_ids for r in alone]


def test_defaults_are_the_model_family_s_own(dream_engine, fixture_engine):
    dream, llada = dream_engine, fixture_engine
    params = SamplingParams(gen_length=8)
    for engine, expected in ((dream, ("dream", "entropy_inverse")), (llada, ("uniform", "top1_prob"))):
        result = engine.generate(prompt_token_ids=[5, 6, 7], params=params)
        assert (result.params.block_schedule, result.params.confidence_metric) == expected
    assert (params.block_schedule, params.confidence_metric) == (None, None)  # the caller's object is untouched


def test_each_family_runs_the_other_family_s_sampler(dream_engine, fixture_engine):
    dream, llada = dream_engine, fixture_engine
    on_llada = llada.generate(
        prompt_token_ids=[5, 6, 7],
        params=SamplingParams(gen_length=32, num_denoising_steps=16, block_schedule="dream", early_exit=False),
    )
    assert [len(step) for step in on_llada.step_commits] == block_quotas("dream", 32, 16)
    on_dream = dream.generate(
        prompt_token_ids=[5, 6, 7],
        params=SamplingParams(gen_length=32, num_denoising_steps=8, block_schedule="uniform", early_exit=False),
    )
    assert [len(step) for step in on_dream.step_commits] == [4] * 8
    assert on_dream.params.confidence_metric == "entropy_inverse"  # the metric left out is still Dream's


def test_local_leap_on_dream_commits_at_least_the_quota_and_saves_forwards(engine):
    case = next(c for c in CASES if c["max_new_tokens"] == 64 and c["steps"] == 64)
    plain = engine.generate(messages=case["messages"], params=dream_params(case, early_exit=False))
    leap = engine.generate(
        messages=case["messages"],
        params=dream_params(case, early_exit=False, use_local_leap=True, local_leap_anchor_threshold=0.2),
    )
    quotas = block_quotas("dream", 64, 64)
    assert all(len(step) >= quota for step, quota in zip(leap.step_commits, quotas))
    assert leap.num_forward_passes < plain.num_forward_passes
    assert MASK not in leap.canvas_ids and sorted(o for s in leap.step_commits for o in s) == list(range(64))


def test_threshold_decoding_works_on_dream_without_a_cache(engine):
    case = next(c for c in CASES if c["max_new_tokens"] == 32 and c["steps"] == 32)
    params = SamplingParams(gen_length=32, block_length=8, confidence_threshold=0.3, early_exit=False)
    result = engine.generate(messages=case["messages"], params=params)
    assert MASK not in result.canvas_ids and all(len(step) >= 1 for step in result.step_commits)
    assert result.num_forward_passes < 32  # several tokens per forward somewhere
    assert (result.params.block_schedule, result.params.confidence_metric) == ("uniform", "entropy_inverse")
    # (with kv_cache, Fast-dLLM's Dream rules: tests/test_dream_kv_cache.py)


def test_stream_deltas_and_stop_strings_work_on_dream(engine):
    case = next(c for c in CASES if c["first_eos_index"] is None and c["first_im_end_index"] is None)
    events = list(engine.stream(messages=case["messages"], params=dream_params(case)))
    result = events[-1].result
    assert "".join(e.text_delta for e in events) == result.text == engine.tokenizer.decode(case["output_ids"])
    assert [e.step for e in events] == list(range(len(events)))
    stop = result.text[3:6]
    cut = engine.generate(messages=case["messages"], params=dream_params(case, stop=stop))
    assert cut.text == result.text[: result.text.index(stop)] and cut.finish_reason == "stop"
