"""Approximate KV cache (prefix / dual) and confidence-threshold decoding, against the official Fast-dLLM code.

The reference runs (tests/fixtures/fast-dllm) were produced by Fast-dLLM's own samplers on the same fixture
checkpoint; the engine must give the same canvas, the same number of forwards, the same commits per forward
and compute the same rows in each forward. Then: cached requests batched with others (cached or not, other
lengths, joining and leaving) must give what they give alone, and the threshold rule is pinned by hand.
"""

from __future__ import annotations

import pytest
import torch

from engine import DiffusionEngine, InvalidParameter, SamplingParams
from engine.kv_slots import kv_slots
from engine.sampler import DenoisingRequest
from tests.fixture_paths import fast_dllm_reference

MODE_OF_FUNCTION = {"generate": "none", "generate_with_prefix_cache": "prefix", "generate_with_dual_cache": "dual"}
# Fast-dLLM's dynamic `factor` rule is out of scope; its dual loop's step cap (which leaves mask tokens in the
# output) is deliberately not reproduced: the engine always completes a block.
NOT_IMPLEMENTED = {"factor", "dual_step_cap"}
CASES = [case for case in fast_dllm_reference()["cases"] if case["tag"] not in NOT_IMPLEMENTED]


@pytest.fixture
def engine(fixture_engine) -> DiffusionEngine:
    return fixture_engine


def params_of(case: dict, **overrides) -> SamplingParams:
    kwargs = case["kwargs"]
    threshold = kwargs["threshold"]
    return SamplingParams(
        gen_length=kwargs["gen_length"],
        block_length=kwargs["block_length"],
        # The official code ignores `steps` under a threshold; the engine refuses it there instead.
        num_denoising_steps=None if threshold is not None else kwargs["steps"],
        kv_cache=MODE_OF_FUNCTION[case["function"]],
        confidence_threshold=threshold,
        **overrides,
    )


class ForwardRows:
    """Wraps the model's forward (the real one runs) and records the canvas rows [start, end) each computed."""

    def __init__(self, model):
        self.real_forward = model.forward
        self.rows: list[tuple[int, int]] = []

    def __call__(self, input_ids, attention_mask=None, logit_index=None, kv=None):
        if kv is None:
            self.rows.append((0, input_ids.shape[1]))
        else:
            columns = kv.columns[0].tolist()  # a lone, unpadded request: its own canvas columns
            self.rows.append((columns[0], columns[-1] + 1))
        return self.real_forward(input_ids, attention_mask, logit_index=logit_index, kv=kv)


def test_the_in_scope_cases_cover_every_mode_and_rule():
    covered = {(MODE_OF_FUNCTION[c["function"]], c["kwargs"]["threshold"] is None) for c in CASES}
    assert covered == {(mode, quota) for mode in ("none", "prefix", "dual") for quota in (True, False)}
    assert len(CASES) == 34


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reproduces_official_fast_dllm_sampler(engine, case, monkeypatch):
    recorder = ForwardRows(engine.model)
    monkeypatch.setattr(engine.model, "forward", recorder)
    result = engine.generate(prompt_token_ids=case["prompt_ids"], params=params_of(case, early_exit=False))
    assert result.canvas_ids == case["output_ids"]
    assert result.num_forward_passes == case["nfe"]
    assert result.step_commits == [sorted(offsets) for offsets in case["step_commits"]]
    assert recorder.rows == [(start, end) for _, start, end in case["forwards"]]


@pytest.mark.parametrize("case", [c for c in CASES if c["tag"] == "threshold"][:6], ids=lambda c: c["id"])
def test_early_exit_stays_lossless_with_the_cache(engine, case):
    full = engine.generate(prompt_token_ids=case["prompt_ids"], params=params_of(case, early_exit=False))
    early = engine.generate(prompt_token_ids=case["prompt_ids"], params=params_of(case))
    assert (early.text, early.token_ids, early.finish_reason) == (full.text, full.token_ids, full.finish_reason)
    assert early.num_forward_passes <= full.num_forward_passes


# --- batched == solo --------------------------------------------------------------------------------

PROMPTS = [case["prompt_ids"] for case in fast_dllm_reference()["cases"]]
MIXED = [
    dict(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="prefix"),
    dict(gen_length=32, block_length=16, num_denoising_steps=32, kv_cache="dual"),
    dict(gen_length=64, block_length=16, kv_cache="dual", confidence_threshold=0.5),
    dict(gen_length=32, block_length=8, kv_cache="prefix", confidence_threshold=0.7),
    dict(gen_length=32, block_length=16, confidence_threshold=0.3),
    dict(gen_length=16, num_denoising_steps=16),
    dict(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="dual", use_local_leap=True),
    dict(gen_length=32, block_length=16, num_denoising_steps=16, kv_cache="prefix", temperature=0.8, seed=3,
         confidence_metric="entropy_inverse"),
    dict(gen_length=48, block_length=16, num_denoising_steps=24, kv_cache="dual", block_schedule="front_loaded",
         temperature=1.2, seed=11),
]  # fmt: skip


def traced(engine: DiffusionEngine, prompt_ids: list[int], params: SamplingParams):
    """A new request whose every proposal records the logits it was given (the model's output for its row)."""
    request, seen = engine.new_request(prompt_token_ids=prompt_ids, params=params), []
    real_propose = request.propose

    def propose(logits, offsets):
        seen.append(logits.clone())
        return real_propose(logits, offsets)

    request.propose = propose
    return request, seen


def assert_caches_are_rows_of(pool: torch.Tensor, requests) -> None:
    """Each request's cache is a view of `pool` (not a copy), as wide as its canvas."""
    for request in requests:
        cache = request.kv_cache_tensor
        assert cache.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()  # a view, not a copy
        assert cache.shape[-2] == request.length


def run_together(engine: DiffusionEngine, requests: list[DenoisingRequest]) -> None:
    """Step the requests in shared forwards, one more joining at each step, each leaving when it finishes:
    the batch's width and every row's padding change from step to step."""
    waiting, active = list(requests), []
    while waiting or active:
        if waiting:
            active.append(waiting.pop(0))
        for event in engine.step(active):
            assert not isinstance(event, Exception), event
        active = [request for request in active if not request.finished]


@pytest.mark.parametrize("order", ["as_listed", "reversed"])
def test_cached_requests_batched_with_others_match_their_solo_runs(engine, order):
    specs = [(PROMPTS[i % len(PROMPTS)], SamplingParams(**kwargs)) for i, kwargs in enumerate(MIXED)]
    if order == "reversed":
        specs.reverse()
    solo = [traced(engine, ids, params) for ids, params in specs]
    for request, _ in solo:
        run_together(engine, [request])
    batched = [traced(engine, ids, params) for ids, params in specs]
    run_together(engine, [request for request, _ in batched])
    for (alone, alone_logits), (together, together_logits) in zip(solo, batched, strict=True):
        assert together.result == alone.result, together.params
        # Same logits too (up to float32 noise): padding, filler columns and other rows' caches stay invisible.
        assert len(together_logits) == len(alone_logits)
        for step_together, step_alone in zip(together_logits, alone_logits):
            torch.testing.assert_close(step_together, step_alone, rtol=0, atol=1e-3)


def test_cache_lives_from_the_first_forward_to_the_end(engine):
    params = SamplingParams(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="dual")
    request = engine.new_request(prompt_token_ids=PROMPTS[0], params=params)
    assert request.kv_cache_tensor is None
    sizes = []
    while not request.finished:
        engine.step([request])
        if not request.finished:
            cache = request.kv_cache_tensor
            sizes.append(cache.numel() * cache.element_size())
    assert request.kv_cache_tensor is None  # released with the result
    assert set(sizes) == {engine.model.kv_bytes(request.length)}


def test_caches_are_rows_of_one_pool_written_in_place_and_freed_at_the_end(engine):
    """Every cached request's cache is a row of the model's preallocated pool (engine/kv_slots.py): a shared step
    neither allocates a buffer nor copies a cache, a request leaving moves the top row into its place intact, and
    the pool's memory goes back when the last cached request ends."""
    params = SamplingParams(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="dual")
    lengths = {len(ids) for ids in PROMPTS}
    short, long = (next(ids for ids in PROMPTS if len(ids) == n) for n in (min(lengths), max(lengths)))
    other = next(ids for ids in PROMPTS if ids not in (short, long))
    together = [engine.new_request(prompt_token_ids=ids, params=params) for ids in (short, long, other)]
    engine.step(together)
    slots = kv_slots(engine.model)
    pool = slots.pool
    assert slots.live == 3 and slots.width > max(r.length for r in together)  # room for the filler column
    assert_caches_are_rows_of(pool, together)
    engine.step(together)
    assert slots.pool is pool  # the step wrote in place: nothing reallocated
    top = together[2].kv_cache_tensor.clone()
    together[0].release()  # the top row moves into the freed one, its cache intact
    assert slots.row_of(together[2]) == 0 and torch.equal(together[2].kv_cache_tensor, top)
    while not all(r.finished for r in together[1:]):
        engine.step([r for r in together[1:] if not r.finished])
    assert slots.live == 0 and slots.pool is None and slots.pool_bytes() == 0


# --- the threshold rule, by hand ----------------------------------------------------------------------


def proposal(engine, logits: list[list[float]], threshold: float) -> list[int]:
    params = SamplingParams(gen_length=len(logits), confidence_threshold=threshold)
    request = engine.new_request(prompt_token_ids=PROMPTS[0], params=params)
    offsets = torch.arange(len(logits))
    return request.propose(torch.tensor(logits), offsets).tolist()


def test_threshold_commits_everything_at_or_above_tau_plus_the_most_confident(engine):
    # Confidences (top-1 softmax): 0.25, 1.0, 1.0, 0.475 (a logit of 50 over zeros is exactly 1.0 in float32).
    logits = [[0, 0, 0, 0], [50, 0, 0, 0], [0, 50, 0, 0], [1, 0, 0, 0]]
    assert proposal(engine, logits, threshold=1.0) == [-1, 0, 1, -1]  # ≥ τ, not > τ
    assert proposal(engine, logits, threshold=0.4) == [-1, 0, 1, 0]
    assert proposal(engine, logits, threshold=0.2) == [0, 0, 1, 0]


def test_threshold_always_commits_one_token_and_ties_go_left(engine):
    # Every candidate below τ: only the most confident is committed; among equals, the leftmost.
    assert proposal(engine, [[1, 0, 0], [2, 0, 0], [0, 2, 0]], threshold=0.99) == [-1, 0, -1]
    assert proposal(engine, [[0, 0, 0], [0, 0, 0], [0, 0, 0]], threshold=0.99) == [0, -1, -1]


# --- parameters -----------------------------------------------------------------------------------------


def test_threshold_resolves_without_a_step_count():
    params = SamplingParams(gen_length=64, block_length=16, confidence_threshold=0.9, kv_cache="dual")
    assert params.num_denoising_steps is None
    assert params.steps_per_block == 16  # at most one forward per token of a block


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(kv_cache="full"), "kv_cache"),
        (dict(kv_cache=None), "kv_cache"),
        (dict(confidence_threshold=0), "confidence_threshold"),
        (dict(confidence_threshold=1.5), "confidence_threshold"),
        (dict(confidence_threshold=-0.1), "confidence_threshold"),
        (dict(confidence_threshold="0.9"), "confidence_threshold"),
        (dict(confidence_threshold=True), "confidence_threshold"),
        (dict(confidence_threshold=0.9, use_local_leap=True), "confidence_threshold"),
        (dict(confidence_threshold=0.9, block_schedule="cosine"), "block_schedule"),
    ],
)
def test_invalid_cache_and_threshold_settings_name_their_field(kwargs, field):
    with pytest.raises(InvalidParameter) as error:
        SamplingParams(gen_length=32, **kwargs)
    assert error.value.field == field


def test_a_step_count_with_a_threshold_is_refused_by_a_llada_model(fixture_engine):
    # SamplingParams accepts the pair (on a block-diffusion model the steps set each forward's minimum quota);
    # the LLaDA family's threshold decoding has no step count, so its engine refuses it.
    params = SamplingParams(gen_length=32, confidence_threshold=0.9, num_denoising_steps=32)
    with pytest.raises(InvalidParameter) as error:
        fixture_engine.new_request(prompt_token_ids=[1, 2, 3], params=params)
    assert error.value.field == "num_denoising_steps"


@pytest.mark.parametrize(("engine_fixture", "cache"), [("fixture_engine", "dual"), ("llada2_engine", "none")])
def test_a_finished_request_stepped_again_is_refused_and_takes_no_pool_row(engine_fixture, cache, request):
    """Stepped directly (the scheduler never does it), a finished request gets an error back, the others in the
    same call still step, and no row is taken: it gave its row back when it finished, and nothing would free a
    second one."""
    engine = request.getfixturevalue(engine_fixture)
    params = SamplingParams(gen_length=16, block_length=8, num_denoising_steps=16, kv_cache=cache)
    done, running = (engine.new_request(prompt_token_ids=PROMPTS[0], params=params) for _ in range(2))
    while not done.finished:
        engine.step([done])
    slots = kv_slots(engine.model)
    assert slots.live == 0
    refused, stepped = engine.step([done, running])
    assert isinstance(refused, ValueError) and "already finished" in str(refused)
    assert not isinstance(stepped, Exception) and slots.live == 1 and slots.row_of(running) == 0
    running.release()
    (alone,) = engine.step([done])  # alone in its call: no forward at all
    assert isinstance(alone, ValueError) and slots.live == 0
