"""Block diffusion (LLaDA2) beyond the reference cases: decision rules at their edges, streaming with editing,
the exact KV cache's spans, size and release, and which knobs each family refuses."""

import dataclasses

import pytest
import torch

from engine import InvalidParameter, SamplingParams, SchedulerConfig
from engine.block_sampler import BlockDiffusionRequest
from engine.kv_slots import kv_slots
from tests.fixture_paths import llada2_cases
from tests.llada2_engine import EOS, MASK, TokenIdText
from tests.llada2_engine import llada2_engine as build_engine
from tests.step_gate import StepByStep
from tests.test_kv_cache import assert_caches_are_rows_of
from tests.test_llada2_reference import CASES, params_of

VOCAB = 512


def request(prompt: list[int], **params) -> BlockDiffusionRequest:
    return BlockDiffusionRequest(
        prompt,
        SamplingParams(**params),
        mask_id=MASK,
        stop_ids=frozenset({EOS}),
        decode=TokenIdText().decode,
        device=torch.device("cpu"),
    )


def logits_with(confidences: list[float], tokens: list[int]) -> torch.Tensor:
    """Logits whose softmax puts exactly `confidence` on `token` (the rest spread evenly, below it)."""
    rows = []
    for confidence, token in zip(confidences, tokens):
        rest = (1 - confidence) / (VOCAB - 1)
        probs = torch.full((VOCAB,), rest, dtype=torch.float64)
        probs[token] = confidence
        rows.append(probs.log())
    return torch.stack(rows).float()


def even_between(token: int) -> torch.Tensor:
    """One row of logits whose softmax is exactly 0.5 on `token` and on `token + 1` (argmax: `token`)."""
    row = torch.full((VOCAB,), float("-inf"))
    row[token] = row[token + 1] = 0.0
    return row


def test_the_canvas_is_whole_blocks_aligned_to_position_zero():
    r = request([1] * 13, gen_length=32, block_length=8, confidence_threshold=0.9)
    assert r.length == 48 and len(r.generated) == 35  # ceil(45 / 8) · 8; 3 positions past the answer
    assert r.block == 1 and r.forward_span() == (0, 16)  # the block holding the prompt's end comes first
    assert r.candidate_offsets() == [0, 1, 2]  # its non-prompt positions


def test_a_confidence_equal_to_the_threshold_is_not_above_it():
    # Three masked positions, quota 2: two sit exactly at τ = 0.5, so fewer than 2 are above → top-2 fallback.
    r = request([1] * 5, gen_length=8, block_length=8, num_denoising_steps=1, confidence_threshold=0.5)
    offsets = r.candidate_offsets()
    assert len(offsets) == 3 and r.quotas == [8]
    r.quotas = [2]
    current = torch.full((3,), MASK)
    logits = torch.stack([even_between(7), even_between(8), logits_with([0.25], [9])[0]])
    assert r.propose(logits, current).tolist() == [7, 8, -1]
    r.params = SamplingParams(gen_length=8, num_denoising_steps=1, confidence_threshold=0.49)
    assert r.propose(logits, current).tolist() == [7, 8, -1]  # now both are above τ (and make the quota)
    # Above τ: all three are committed, more than the quota.
    chosen = r.propose(logits_with([0.6, 0.7, 0.8], [7, 8, 9]), current).tolist()
    assert chosen == [7, 8, 9]


def test_equal_confidences_commit_the_leftmost():
    r = request([1] * 5, gen_length=8, block_length=8, confidence_threshold=0.99)
    current = torch.full((3,), MASK)
    assert r.propose(logits_with([0.3, 0.3, 0.3], [7, 8, 9]), current).tolist() == [7, -1, -1]


def test_editing_overwrites_only_written_positions_above_the_editing_threshold():
    r = request([1] * 5, gen_length=8, block_length=8, confidence_threshold=0.9, editing_threshold=0.5)
    current = torch.tensor([MASK, 20, 21])  # offset 0 masked; 1 and 2 already written
    # Offset 1: another token at 0.6 > 0.5 → edited. Offset 2: its own token again → unchanged.
    chosen = r.propose(logits_with([0.2, 0.6, 0.95], [7, 30, 21]), current).tolist()
    assert chosen == [7, 30, -1]  # offset 0 is the quota's one commit (0.2 < τ)
    logits = logits_with([0.2, 0.6, 0.95], [7, 30, 21])
    logits[1] = even_between(30)
    exact = r.propose(logits, current).tolist()
    assert exact == [7, -1, -1]  # exactly at the editing threshold: not above it


def run_events(engine, case):
    return list(engine.stream(prompt_token_ids=case["prompt_ids"], params=params_of(case)))


@pytest.mark.parametrize("case_id", ["a18_llada21_blockcausal", "a20_llada21_blockcausal"])
def test_with_editing_text_is_final_when_its_block_closes(llada2_engine, case_id):
    case = next(c for c in CASES if c["id"] == case_id)
    events = run_events(llada2_engine, case)
    result = events[-1].result
    assert "".join(e.text_delta for e in events) == result.text
    assert [[o for o, _ in e.edited] for e in events] == result.step_edits
    assert any(e.edited for e in events)
    block, prompt = case["kwargs"]["block_length"], len(case["prompt_ids"])
    decode, streamed = TokenIdText().decode, ""
    for event in events[:-1]:
        streamed += event.text_delta
        # What has been streamed is exactly the answer's closed blocks (as they finally read).
        closed_end = (prompt // block + event.block + (1 if event.text_delta else 0)) * block - prompt
        if event.text_delta:
            assert streamed == decode(result.token_ids[:closed_end])
        assert len(streamed) <= len(decode(result.token_ids[: max(closed_end, 0)]))


def test_without_editing_the_committed_prefix_streams_as_it_grows(llada2_engine):
    case = next(c for c in CASES if c["id"] == "a01_llada20")
    events = run_events(llada2_engine, case)
    result = events[-1].result
    deltas = [e for e in events if e.text_delta]
    assert len(deltas) > case["kwargs"]["gen_length"] // case["kwargs"]["block_length"]  # more than once a block
    assert "".join(e.text_delta for e in events) == result.text
    assert all(not e.edited for e in events)


def test_each_forward_computes_only_the_uncached_blocks(llada2_engine):
    prompt = list(range(480))
    r = llada2_engine.new_request(
        prompt_token_ids=prompt, params=SamplingParams(gen_length=32, block_length=8, confidence_threshold=0.9)
    )
    assert r.kv_cache_bytes == llada2_engine.model.kv_bytes(512)
    spans = []
    while not r.finished:
        spans.append(r.forward_span())
        (event,) = llada2_engine.step([r])
        assert not isinstance(event, Exception)
    assert spans[0] == (0, 488)  # the prompt's blocks and the first answer block, once
    block_firsts = {s for s in spans[1:] if s[1] - s[0] == 16}  # a block's first forward re-takes the finished one
    assert all(end - start in (8, 16) for start, end in spans[1:])
    assert block_firsts == {(480, 496), (488, 504), (496, 512)}
    assert r.kv_cache_tensor is None  # released at the end


def step_all(engine, requests):
    for event in engine.step(requests):
        assert not isinstance(event, Exception)


def test_block_caches_are_rows_of_the_models_one_pool_written_in_place(llada2_engine):
    """Concurrent block requests keep their caches in the model's preallocated KV pool (engine/kv_slots.py): a
    shared step allocates nothing and copies no cache, a live row that is not stepped is left intact, a
    cancelled request's row is reused by the top one, and every request's output equals its solo run."""
    # One token per forward and at least 4 masks in each first block: no request ends within the first 3 steps.
    params = SamplingParams(gen_length=32, block_length=8, num_denoising_steps=32, early_exit=False)
    prompts = [list(range(1, 3)), list(range(3, 22)), list(range(7, 19))]  # canvases 40, 56, 48: ragged spans
    alone = [llada2_engine.generate(prompt_token_ids=ids, params=params) for ids in prompts]
    slots = kv_slots(llada2_engine.model)
    assert slots.live == 0 and slots.pool is None
    cancelled = llada2_engine.new_request(prompt_token_ids=list(range(9, 34)), params=params)
    together = [llada2_engine.new_request(prompt_token_ids=ids, params=params) for ids in prompts]
    batch = [cancelled, *together]
    assert all(r.kv_cache_tensor is None for r in batch)
    step_all(llada2_engine, batch)
    pool = slots.pool
    assert slots.live == 4 and slots.width > max(r.length for r in batch)  # room for the filler column
    assert_caches_are_rows_of(pool, batch)
    step_all(llada2_engine, batch)
    assert slots.pool is pool  # the step wrote in place: nothing reallocated
    skipped = together[0].kv_cache_tensor.clone()  # row 1, between stepped rows: runs as a dummy
    step_all(llada2_engine, [cancelled, *together[1:]])
    assert not any(r.finished for r in batch)
    assert slots.pool is pool and torch.equal(together[0].kv_cache_tensor, skipped)
    top = together[2].kv_cache_tensor.clone()
    cancelled.release()  # the top row moves into the freed one, its cache intact
    assert cancelled.kv_cache_tensor is None and slots.live == 3
    assert slots.row_of(together[2]) == 0 and torch.equal(together[2].kv_cache_tensor, top)
    while not all(r.finished for r in together):
        step_all(llada2_engine, [r for r in together if not r.finished])
    assert [r.result for r in together] == alone
    assert slots.live == 0 and slots.pool is None  # every row given back


def test_a_cancelled_request_releases_its_cache(llada2_engine):
    engine = build_engine(llada2_engine.model)
    gate = StepByStep(engine)
    engine.step = gate
    try:
        case = CASES[0]
        stream = engine.stream(prompt_token_ids=case["prompt_ids"], params=params_of(case))
        gate.permits.release(1)
        next(stream)  # one forward has run: the cache exists and is reserved
        gate.wait_for_arrival(2)  # the scheduler holds the request before its second step
        (request,) = gate.batches[0]
        assert request.kv_cache_tensor is not None
        assert engine.stats.snapshot()["dllm_kv_cache_bytes"] == request.kv_cache_bytes == engine.model.kv_bytes(64)
        stream.close()  # the consumer leaves
        gate.run_freely()
        engine.shutdown(timeout=30)
        assert request.kv_cache_tensor is None
        assert engine.stats.snapshot()["dllm_kv_cache_bytes"] == 0
    finally:
        gate.run_freely()
        engine.shutdown()


def test_a_cache_larger_than_the_whole_budget_is_refused(llada2_engine):
    engine = build_engine(llada2_engine.model, SchedulerConfig(kv_cache_budget_bytes=llada2_engine.model.kv_bytes(40)))
    with pytest.raises(InvalidParameter) as error:
        engine.new_request(prompt_token_ids=[1] * 13, params=SamplingParams(gen_length=32, block_length=8))
    assert error.value.field == "gen_length"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(kv_cache="prefix"), "kv_cache"),
        (dict(kv_cache="dual"), "kv_cache"),
        (dict(block_schedule="cosine"), "block_schedule"),
        (dict(block_schedule="dream"), "block_schedule"),
        (dict(confidence_metric="margin"), "confidence_metric"),
        (dict(confidence_metric="entropy_inverse"), "confidence_metric"),
        (dict(use_local_leap=True), "use_local_leap"),
    ],
)
def test_knobs_of_the_other_samplers_are_refused_on_llada2(llada2_engine, kwargs, field):
    with pytest.raises(InvalidParameter) as error:
        llada2_engine.new_request(prompt_token_ids=[1, 2], params=SamplingParams(gen_length=16, **kwargs))
    assert error.value.field == field


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(editing_threshold=0.9), "editing_threshold"),
        (dict(editing_threshold=0.9, max_post_steps=4), "editing_threshold"),
    ],
)
@pytest.mark.parametrize("engine_name", ["fixture_engine", "dream_engine"])
def test_editing_knobs_are_refused_on_llada_and_dream(request, engine_name, kwargs, field):
    engine = request.getfixturevalue(engine_name)
    with pytest.raises(InvalidParameter) as error:
        engine.new_request(prompt_token_ids=[1, 2], params=SamplingParams(gen_length=16, **kwargs))
    assert error.value.field == field


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_post_steps=4), "max_post_steps"),  # without editing_threshold
        (dict(min_tokens_per_step=2), "min_tokens_per_step"),
        (dict(editing_threshold=1.5), "editing_threshold"),
        (dict(editing_threshold=-0.1), "editing_threshold"),
        (dict(editing_threshold="0.9"), "editing_threshold"),
        (dict(editing_threshold=0.9, max_post_steps=-1), "max_post_steps"),
        (dict(editing_threshold=0.9, max_post_steps=1.5), "max_post_steps"),
        (dict(editing_threshold=0.9, min_tokens_per_step=0), "min_tokens_per_step"),
        (dict(editing_threshold=0.9, min_tokens_per_step=9), "min_tokens_per_step"),  # more than a block
        (dict(editing_threshold=0.9, num_denoising_steps=4), "num_denoising_steps"),  # 2.1 has no schedule
    ],
)
def test_editing_knob_values_are_checked(kwargs, field):
    with pytest.raises(InvalidParameter) as error:
        SamplingParams(gen_length=16, block_length=8, **kwargs)
    assert error.value.field == field


def test_editing_knob_defaults():
    params = SamplingParams(gen_length=16, block_length=8, editing_threshold=0.9)
    assert (params.max_post_steps, params.min_tokens_per_step, params.uses_editing) == (16, 1, True)
    assert not SamplingParams(gen_length=16, editing_threshold=1.0).uses_editing  # 1 never edits (strict >)
    plain = SamplingParams(gen_length=16)
    assert (plain.editing_threshold, plain.max_post_steps, plain.min_tokens_per_step) == (None, None, None)


def test_the_fixture_meta_pins_the_special_ids():
    meta = llada2_cases()["meta"]
    assert (meta["eos_id"], meta["mask_id"]) == (EOS, MASK)


def test_a_stop_string_cuts_the_text_and_ends_the_request(llada2_engine):
    case = next(c for c in CASES if c["id"] == "a01_llada20")
    full = llada2_engine.generate(prompt_token_ids=case["prompt_ids"], params=params_of(case))
    stop = TokenIdText().decode([full.token_ids[5]])
    cut = full.text[: full.text.index(stop)]
    params = dataclasses.replace(params_of(case), stop=(stop,))
    result = llada2_engine.generate(prompt_token_ids=case["prompt_ids"], params=params)
    assert (result.text, result.finish_reason) == (cut, "stop")
    assert TokenIdText().decode(result.token_ids).startswith(cut)
    assert result.num_forward_passes < full.num_forward_passes


@pytest.mark.parametrize("temperature", [1e-308, 0.7])
@pytest.mark.parametrize("editing_threshold", [None, 0.5])
def test_sampling_is_reproducible_by_seed_and_finite_at_any_temperature(llada2_engine, temperature, editing_threshold):
    params = SamplingParams(
        gen_length=16,
        block_length=8,
        temperature=temperature,
        seed=3,
        confidence_threshold=0.8,
        editing_threshold=editing_threshold,
        early_exit=False,
    )
    runs = [llada2_engine.generate(prompt_token_ids=list(range(20)), params=params) for _ in range(2)]
    assert runs[0].canvas_ids == runs[1].canvas_ids
    assert all(t < EOS for t in runs[0].token_ids)
    if temperature < 1e-300 and editing_threshold is None:
        # The tempered distribution is a point mass: confidence 1 > τ everywhere, so a block takes one forward
        # (a NaN confidence would fail every comparison and fall back to one token per forward).
        assert runs[0].num_forward_passes <= 3  # the canvas has 3 blocks
