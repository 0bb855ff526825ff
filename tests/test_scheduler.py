"""The batching scheduler and the engine's two APIs on top of it (engine/scheduler.py,
engine/batching_policy.py; DiffusionEngine.stream/generate and astream/agenerate).

Real models, no mocks of the model. Where a test needs to hold the scheduler still (overload bound,
shutdown) or to see which requests shared a forward, it wraps `engine.step` and still calls the real one.
Time bounds (`HANG_GUARD_S`) only turn a hang into a failure; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine import (
    DiffusionEngine,
    EngineOverloaded,
    EngineShutdown,
    GenerationResult,
    InvalidParameter,
    Prompt,
    SamplingParams,
    SchedulerConfig,
)
from engine.batching_policy import ForwardCost, length_groups, next_batch
from engine.memory import default_kv_cache_budget
from tests.fixture_paths import EMBEDDED_MODEL_DIR, FIXTURE_DIR
from tests.step_gate import StepByStep

HANG_GUARD_S = 120

# Prompts of very different lengths: the longest canvases are over twice the shortest, so the mixed batch
# also exercises the length-group split of the padding policy.
SHORT = [{"role": "user", "content": "Hi"}]
MEDIUM = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [
    {"role": "system", "content": "You are a helpful assistant who answers briefly and precisely."},
    {"role": "user", "content": "Name three colours of the rainbow, then count from one to five in words. " * 2},
]

# (messages, params): every knob the sampler has, mixed in one concurrent batch.
MIXED_REQUESTS = [
    (SHORT, dict(gen_length=16, num_denoising_steps=16)),
    (MEDIUM, dict(gen_length=32, block_length=8, num_denoising_steps=16, block_schedule="front_loaded")),
    (LONG, dict(gen_length=32, block_length=16, num_denoising_steps=8, block_schedule="cosine")),
    (SHORT, dict(gen_length=24, block_length=8, num_denoising_steps=24, confidence_metric="entropy_inverse")),
    (MEDIUM, dict(gen_length=32, num_denoising_steps=32, use_local_leap=True)),
    (LONG, dict(gen_length=48, block_length=16, num_denoising_steps=12, use_local_leap=True, local_leap_radius=2)),
    (MEDIUM, dict(gen_length=16, num_denoising_steps=8, early_exit=False)),
    (SHORT, dict(gen_length=32, block_length=32, num_denoising_steps=16, block_schedule="cosine",
                 confidence_metric="entropy_inverse", use_local_leap=True, local_leap_anchor_threshold=0.5)),
]  # fmt: skip


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, HANG_GUARD_S))


def fresh(base: DiffusionEngine, **config) -> DiffusionEngine:
    """An engine sharing `base`'s weights and tokenizer, with its own scheduler and statistics."""
    return DiffusionEngine(base.model, base.tokenizer, base.device, base.model_name, SchedulerConfig(**config))


class StepRecorder:
    """Wraps engine.step (the real one runs): records each batch and the thread that ran it, and can hold
    the scheduler at a gate."""

    def __init__(self, engine: DiffusionEngine, gated: bool = False):
        self.real_step = engine.step
        self.batches: list[list] = []
        self.threads: set[threading.Thread] = set()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.entered = threading.Event()

    def __call__(self, requests):
        self.entered.set()
        self.gate.wait(HANG_GUARD_S)
        self.batches.append(list(requests))
        self.threads.add(threading.current_thread())
        return self.real_step(requests)


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def wait_until(condition) -> None:
    """`until` for tests without an event loop; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)


def snapshot_has(engine: DiffusionEngine, **expected) -> bool:
    stats = engine.stats.snapshot()
    return all(stats[name] == value for name, value in expected.items())


async def collect(engine: DiffusionEngine, messages, params: SamplingParams):
    return [event async for event in engine.astream(messages=messages, params=params)]


# --- batched output equals solo output --------------------------------------------------------------


@pytest.mark.parametrize(
    "model_dir",
    [
        pytest.param(FIXTURE_DIR, id="fixture"),
        pytest.param(EMBEDDED_MODEL_DIR, id="embedded"),
    ],
)
def test_mixed_concurrent_batch_is_token_identical_to_solo_runs(model_dir, request):
    base = request.getfixturevalue("fixture_engine" if model_dir == FIXTURE_DIR else "embedded_engine")
    engine = fresh(base, max_batch_size=8, max_wait_ms=100)  # start the burst together
    cases = [(messages, SamplingParams(**kwargs)) for messages, kwargs in MIXED_REQUESTS]
    solo = [list(base.stream(messages=messages, params=params)) for messages, params in cases]

    async def concurrently():
        return await asyncio.gather(*(collect(engine, messages, params) for messages, params in cases))

    batched = run(concurrently())
    engine.shutdown()

    for (_, params), alone, together in zip(cases, solo, batched, strict=True):
        # Every event (steps, commits, text deltas) and the final result, token for token.
        assert together == alone, params
    stats = engine.stats.snapshot()
    batch_sizes = stats["dllm_batch_size"]
    assert batch_sizes["count"] > batch_sizes["buckets"]["1"], "no forward was shared by two requests"
    assert stats["dllm_requests_total"] == len(cases)
    assert stats["dllm_forward_passes_total"] == batch_sizes["count"]
    assert stats["dllm_batch_size"]["sum"] == sum(len(events) for events in solo)
    assert stats["dllm_tokens_committed_total"] == sum(len(e.committed) for events in solo for e in events)
    assert stats["dllm_request_duration_seconds"]["count"] == len(cases)
    assert stats["dllm_requests_running"] == stats["dllm_requests_waiting"] == 0


def test_force_single_batch_requests_run_alone_and_reproduce_sampled_output(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine, max_batch_size=8, max_wait_ms=100)
    recorder = StepRecorder(engine)
    monkeypatch.setattr(engine, "step", recorder)
    forced = [
        SamplingParams(gen_length=32, num_denoising_steps=16, temperature=temperature, seed=seed,
                       force_single_batch=True)
        for temperature, seed in ((0.7, 1), (1.0, 2), (1.5, 3))
    ]  # fmt: skip
    # Same canvas length (no padding), so the padding policy always lets these three share forwards.
    shared = [SamplingParams(gen_length=32, num_denoising_steps=32, temperature=0.9, seed=s) for s in (4, 5, 6)]
    prompts = [SHORT, MEDIUM, LONG]

    async def concurrently():
        pairs = zip(prompts + [SHORT] * 3, forced + shared, strict=True)
        return await asyncio.gather(*(engine.agenerate(messages=m, params=p) for m, p in pairs))

    results = run(concurrently())
    engine.shutdown()

    for messages, params, result in zip(prompts, forced, results[:3], strict=True):
        assert result == fixture_engine.generate(messages=messages, params=params)
    for batch in recorder.batches:
        if any(r.params.force_single_batch for r in batch):
            assert len(batch) == 1
    assert max(len(batch) for batch in recorder.batches) > 1  # the others did share forwards


class FakeHandle:  # just what the padding policy reads
    def __init__(self, length: int, alone: bool = False, order: int = 0):
        self.step_width, self.runs_alone, self.order, self.start_tag = length, alone, order, 0.0


def test_padding_policy_groups_step_widths_by_forward_cost():
    lengths = [48, 50, 51, 47, 71, 160]
    handles = [FakeHandle(n, order=i) for i, n in enumerate(lengths)] + [FakeHandle(30, alone=True, order=9)]

    def grouped(overhead_tokens, token_budget=float("inf")):
        return [[h.step_width for h in g] for g in length_groups(handles, overhead_tokens, token_budget)]

    # A forward that costs nothing by itself: never pay for padding.
    assert grouped(0.0) == [[30], [47], [48], [50], [51], [71], [160]]
    # A CPU-like overhead (tens of tokens): the close lengths share, the outliers run on their own.
    assert grouped(30.0) == [[30], [47, 48, 50, 51], [71], [160]]
    # A GPU-like overhead: padding is cheaper than another forward; force_single_batch still runs alone.
    assert grouped(1e4) == [[30], [47, 48, 50, 51, 71, 160]]
    # A token budget: however cheap padding is, a group computes at most that many positions.
    assert grouped(1e4, token_budget=200) == [[30], [47, 48, 50], [51, 71], [160]]
    # Turns: the group of the request whose next step is due first (the smallest start tag) goes next.
    handles[4].start_tag = handles[5].start_tag = 0.3
    for h in handles[:4] + handles[6:]:
        h.start_tag = 0.5
    assert [h.step_width for h in next_batch(handles, 30.0)] == [71]


def test_forward_cost_fit_recovers_the_fixed_cost_of_a_forward():
    cost = ForwardCost(prior_overhead_tokens=256.0)
    for _ in range(20):  # same-size forwards say nothing about the split: the prior stays
        cost.observe(400, 0.006)
    assert cost.overhead_tokens == 256.0
    for tokens in [50, 400, 100, 800, 200] * 10:  # 2 ms per forward + 10 µs per token
        cost.observe(tokens, 0.002 + 1e-5 * tokens)
    assert cost.overhead_tokens == pytest.approx(200.0, rel=0.05)
    cost.observe(100, 5.0)  # a pause (GC, compilation) barely moves the estimate
    assert cost.overhead_tokens == pytest.approx(200.0, rel=0.2)


# --- one execution model: the sync API goes through the scheduler thread too -----------------------


def test_sync_and_async_requests_share_the_scheduler_thread_and_its_forwards(fixture_engine, monkeypatch):
    """`generate`/`stream` from other threads and `agenerate` at once: the model runs on the scheduler
    thread alone, sync and async requests share forwards, and every output is the solo one."""
    engine = fresh(fixture_engine, max_batch_size=8)
    recorder = StepRecorder(engine, gated=True)  # hold the first step until all six are queued
    monkeypatch.setattr(engine, "step", recorder)
    sync_seeds, async_seeds = (1, 2, 3), (11, 12, 13)
    # One prompt for all: equal rows, so the padding policy always lets them share a forward.
    params = {seed: SamplingParams(gen_length=32, num_denoising_steps=16, temperature=0.8, seed=seed)
              for seed in sync_seeds + async_seeds}  # fmt: skip

    async def scenario():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=len(sync_seeds)) as pool:
            sync_jobs = [
                loop.run_in_executor(pool, functools.partial(engine.generate, messages=SHORT, params=params[1])),
                loop.run_in_executor(pool, functools.partial(engine.generate, messages=SHORT, params=params[2])),
                loop.run_in_executor(pool, lambda: list(engine.stream(messages=SHORT, params=params[3]))),
            ]
            async_jobs = [engine.agenerate(messages=SHORT, params=params[seed]) for seed in async_seeds]
            async_tasks = [asyncio.ensure_future(job) for job in async_jobs]
            await until(lambda: engine.stats.snapshot()["dllm_requests_total"] == 6)
            recorder.gate.set()
            return await asyncio.gather(*sync_jobs, *async_tasks)

    first, second, streamed, *async_results = run(scenario())
    engine.shutdown()

    solo = {seed: fixture_engine.generate(messages=SHORT, params=params[seed]) for seed in (1, 2, *async_seeds)}
    assert [first, second, *async_results] == [solo[s] for s in (1, 2, *async_seeds)]
    assert streamed == list(fixture_engine.stream(messages=SHORT, params=params[3]))
    assert [thread.name for thread in recorder.threads] == ["dllm-scheduler"]
    seeds_per_forward = [{request.params.seed for request in batch} for batch in recorder.batches]
    assert any(seeds & set(sync_seeds) and seeds & set(async_seeds) for seeds in seeds_per_forward)


def test_closing_a_sync_stream_early_cancels_its_request(fixture_engine):
    engine = fresh(fixture_engine, max_batch_size=1)
    long_params = SamplingParams(gen_length=64, num_denoising_steps=64, early_exit=False)
    events = engine.stream(messages=MEDIUM, params=long_params)
    assert next(events).step == 0
    events.close()  # what leaving a `for` loop over it early does, once the iterator is collected
    wait_until(lambda: engine.stats.snapshot()["dllm_requests_cancelled_total"] == 1)
    assert engine.stats.snapshot()["dllm_requests_running"] == 0
    params = SamplingParams(gen_length=16, num_denoising_steps=16)
    assert engine.generate(messages=SHORT, params=params) == fixture_engine.generate(messages=SHORT, params=params)
    engine.shutdown()


def test_generate_is_woken_once_with_the_last_event(fixture_engine):
    """`generate` needs only the result: its thread gets the last event alone, not one wake-up per step."""
    engine = fresh(fixture_engine)
    params = SamplingParams(gen_length=32, num_denoising_steps=32, early_exit=False)
    request = engine.new_request(messages=SHORT, params=params)
    handle = engine._running_scheduler().submit(request, every_event=False)
    event = handle.wait_event()
    engine.shutdown()
    assert event.finished and event.step == 31
    assert event.result == fixture_engine.generate(messages=SHORT, params=params)


# --- cancellation, overload, failures, shutdown -----------------------------------------------------


def test_cancellation_frees_the_slot(fixture_engine):
    engine = fresh(fixture_engine, max_batch_size=1, max_waiting=4)
    long_params = SamplingParams(gen_length=64, num_denoising_steps=64, early_exit=False)
    params = SamplingParams(gen_length=16, num_denoising_steps=16)

    async def scenario():
        # 1. The consumer leaves after the first event (an HTTP client disconnecting mid-stream).
        events = engine.astream(messages=MEDIUM, params=long_params)
        first = await events.__anext__()
        assert first.step == 0 and not first.finished
        await events.aclose()
        await until(lambda: engine.stats.snapshot()["dllm_requests_cancelled_total"] == 1)

        # 2. A task cancelled while running, and one cancelled while still waiting for the only slot.
        running = asyncio.create_task(engine.agenerate(messages=MEDIUM, params=long_params))
        waiting = asyncio.create_task(engine.agenerate(messages=SHORT, params=long_params))
        admitted_one = dict(dllm_requests_total=3, dllm_requests_running=1, dllm_requests_waiting=1)
        await until(lambda: snapshot_has(engine, **admitted_one))
        for task in (waiting, running):
            task.cancel()
        for task in (waiting, running):
            with pytest.raises(asyncio.CancelledError):
                await task
        await until(lambda: engine.stats.snapshot()["dllm_requests_cancelled_total"] == 3)
        assert engine.stats.snapshot()["dllm_requests_running"] == 0
        assert engine.stats.snapshot()["dllm_requests_waiting"] == 0

        # 3. The freed slot serves the next request.
        return await engine.agenerate(messages=SHORT, params=params)

    result = run(scenario())
    engine.shutdown()
    assert result == fixture_engine.generate(messages=SHORT, params=params)
    stats = engine.stats.snapshot()
    assert stats["dllm_requests_cancelled_total"] == 3
    assert stats["dllm_request_duration_seconds"]["count"] == 1  # only the completed one


def test_overload_fires_exactly_at_the_bound(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine, max_batch_size=2, max_waiting=3)
    recorder = StepRecorder(engine, gated=True)  # nothing finishes while we fill the queue
    monkeypatch.setattr(engine, "step", recorder)
    params = SamplingParams(gen_length=16, num_denoising_steps=8)

    async def scenario():
        accepted = [asyncio.create_task(engine.agenerate(messages=SHORT, params=params)) for _ in range(5)]
        await until(lambda: engine.stats.snapshot()["dllm_requests_total"] == 5)
        with pytest.raises(EngineOverloaded):
            await engine.agenerate(messages=SHORT, params=params)
        with pytest.raises(EngineOverloaded):  # raised before any event, from astream too
            await anext(engine.astream(messages=SHORT, params=params))
        with pytest.raises(EngineOverloaded):  # and from the sync API, which shares the queue
            engine.generate(messages=SHORT, params=params)
        recorder.gate.set()
        results = await asyncio.gather(*accepted)
        # Capacity is back once requests finish.
        results.append(await engine.agenerate(messages=SHORT, params=params))
        return results

    results = run(scenario())
    engine.shutdown()
    expected = fixture_engine.generate(messages=SHORT, params=params)
    assert results == [expected] * 6
    assert engine.stats.snapshot()["dllm_requests_total"] == 6  # rejected requests are not counted


def test_a_cancelled_waiting_request_frees_its_queue_place_at_once(fixture_engine, monkeypatch):
    """A client that gives up while queued frees its place at the scheduler's next iteration, even though the
    running request keeps the only slot: a new request is then accepted instead of a 429."""
    engine = fresh(fixture_engine, max_batch_size=1, max_waiting=1)
    steps = StepByStep(engine)
    monkeypatch.setattr(engine, "step", steps)
    long_params = SamplingParams(gen_length=64, num_denoising_steps=64, early_exit=False)
    params = SamplingParams(gen_length=16, num_denoising_steps=16)

    async def scenario():
        running = asyncio.create_task(engine.agenerate(messages=MEDIUM, params=long_params))
        await asyncio.to_thread(steps.wait_for_arrival, 1)  # its first step, held
        queued = asyncio.create_task(engine.agenerate(messages=SHORT, params=params))
        await until(lambda: snapshot_has(engine, dllm_requests_running=1, dllm_requests_waiting=1))
        with pytest.raises(EngineOverloaded):  # one running + one waiting: full
            await engine.agenerate(messages=SHORT, params=params)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        steps.permits.release()  # one step, then the scheduler's next admission pass, then the next step
        await asyncio.to_thread(steps.wait_for_arrival, 2)
        assert snapshot_has(engine, dllm_requests_running=1, dllm_requests_waiting=0, dllm_requests_cancelled_total=1)
        accepted = asyncio.create_task(engine.agenerate(messages=SHORT, params=params))  # would be a 429
        await until(lambda: snapshot_has(engine, dllm_requests_waiting=1))
        steps.run_freely()
        return await asyncio.gather(running, accepted)

    results = run(scenario())
    engine.shutdown()
    assert results == [
        fixture_engine.generate(messages=MEDIUM, params=long_params),
        fixture_engine.generate(messages=SHORT, params=params),
    ]


def test_invalid_requests_fail_before_any_event(fixture_engine):
    engine = fresh(fixture_engine)
    too_long = SamplingParams(gen_length=engine.max_sequence_length)

    async def scenario():
        with pytest.raises(InvalidParameter) as error:
            await engine.agenerate(messages=MEDIUM, params=too_long)
        assert error.value.field == "gen_length"
        with pytest.raises(InvalidParameter):
            await anext(engine.astream(prompt_token_ids=[engine.tokenizer.mask_id]))
        with pytest.raises(ValueError):
            await engine.agenerate()

    run(scenario())
    assert engine.stats.snapshot()["dllm_requests_total"] == 0
    engine.shutdown()


def test_prompts_are_tokenized_off_the_event_loop_in_call_order(fixture_engine, monkeypatch):
    """A huge prompt takes seconds to tokenize: that must not stall the event loop (health checks, other
    streams). Checked by where the work runs, not by timing."""
    engine = fresh(fixture_engine)
    real_encode = engine.tokenizer.encode_chat
    seen: list[tuple[str, threading.Thread]] = []

    def recording_encode(messages):
        seen.append((messages[0]["content"], threading.current_thread()))
        return real_encode(messages)

    monkeypatch.setattr(engine.tokenizer, "encode_chat", recording_encode)
    params = SamplingParams(gen_length=16, num_denoising_steps=8)

    async def scenario():
        contents = [f"request {i}" for i in range(6)]
        calls = [engine.agenerate(messages=[{"role": "user", "content": c}], params=params) for c in contents]
        await asyncio.gather(*calls)
        return contents

    contents = run(scenario())
    engine.shutdown()
    assert [content for content, _ in seen] == contents  # call order kept
    assert all(thread is not threading.main_thread() for _, thread in seen)  # asyncio.run's loop is on main


def test_a_request_with_bad_token_ids_is_refused_alone(fixture_engine):
    # An id past the embedding would fail the shared forward, and with it every batch-mate.
    engine = fresh(fixture_engine, max_batch_size=8, max_wait_ms=100)
    params = SamplingParams(gen_length=16, num_denoising_steps=8)

    async def scenario():
        good = [engine.agenerate(prompt_token_ids=[5, 6, 7], params=params) for _ in range(3)]
        bad = engine.agenerate(prompt_token_ids=[5, engine.model.config.vocab_size], params=params)
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *results, refused = run(scenario())
    engine.shutdown()
    assert isinstance(refused, InvalidParameter) and refused.field == "prompt_token_ids"
    assert results == [fixture_engine.generate(prompt_token_ids=[5, 6, 7], params=params)] * 3


def test_a_failing_request_does_not_affect_its_batch_mates(fixture_engine, monkeypatch):
    engine = fresh(fixture_engine, max_batch_size=8, max_wait_ms=100)
    poisoned_seed = 666
    real_new_request = engine.new_request

    def new_request(*args, **kwargs):
        request = real_new_request(*args, **kwargs)
        if request.params.seed == poisoned_seed:
            real_propose, calls = request.propose, []

            def propose(logits, offsets):
                calls.append(1)
                if len(calls) == 3:
                    raise RuntimeError("poisoned propose")
                return real_propose(logits, offsets)

            request.propose = propose
        return request

    monkeypatch.setattr(engine, "new_request", new_request)
    recorder = StepRecorder(engine)
    monkeypatch.setattr(engine, "step", recorder)
    healthy = [SamplingParams(gen_length=32, num_denoising_steps=32, seed=s, early_exit=False) for s in (1, 2, 3)]
    poisoned = SamplingParams(gen_length=32, num_denoising_steps=32, seed=poisoned_seed, early_exit=False)
    # Equal canvas lengths: no padding, so the padding policy always keeps the four in one forward.
    prompts = [[token] * 20 for token in (40, 50, 60, 70)]

    async def scenario():
        pairs = zip(prompts, [*healthy, poisoned], strict=True)
        jobs = [engine.agenerate(prompt_token_ids=ids, params=p) for ids, p in pairs]
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = run(scenario())
    assert isinstance(results[3], RuntimeError) and str(results[3]) == "poisoned propose"
    for ids, params, result in zip(prompts[:3], healthy, results[:3], strict=True):
        assert result == fixture_engine.generate(prompt_token_ids=ids, params=params)
    assert any(len(batch) == 4 for batch in recorder.batches)  # the poisoned step was a shared one

    # A forward that fails fails its whole batch, and the scheduler keeps serving.
    def broken_step(requests):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(engine, "step", broken_step)
    with pytest.raises(RuntimeError, match="forward failed"):
        run(engine.agenerate(prompt_token_ids=prompts[0], params=healthy[0]))
    monkeypatch.setattr(engine, "step", recorder)
    assert run(engine.agenerate(prompt_token_ids=prompts[0], params=healthy[0])) == results[0]
    assert engine.stats.snapshot()["dllm_requests_running"] == 0
    engine.shutdown()


@pytest.mark.parametrize("drain", [False, True])
def test_shutdown_finishes_or_fails_every_pending_request(fixture_engine, monkeypatch, drain):
    engine = fresh(fixture_engine, max_batch_size=2, max_waiting=8)
    recorder = StepRecorder(engine, gated=True)
    monkeypatch.setattr(engine, "step", recorder)
    params = SamplingParams(gen_length=16, num_denoising_steps=16)

    async def scenario():
        pending = [asyncio.create_task(engine.agenerate(messages=SHORT, params=params)) for _ in range(5)]
        await until(lambda: recorder.entered.is_set() and engine.stats.snapshot()["dllm_requests_total"] == 5)
        scheduler, loop = engine._scheduler, asyncio.get_running_loop()
        stopping = loop.run_in_executor(None, lambda: engine.shutdown(drain=drain))
        await until(lambda: scheduler._stopping)  # flagged while the first step is still held
        with pytest.raises(EngineShutdown):  # a stopping scheduler accepts nothing new
            scheduler.submit(engine.new_request(messages=SHORT, params=params), loop)
        recorder.gate.set()
        await stopping
        return await asyncio.gather(*pending, return_exceptions=True)

    outcomes = run(scenario())
    expected = fixture_engine.generate(messages=SHORT, params=params)
    if drain:
        assert outcomes == [expected] * 5
    else:
        assert all(isinstance(o, EngineShutdown) for o in outcomes), outcomes
    assert engine.stats.snapshot()["dllm_requests_running"] == 0
    # The engine stays usable: the next async call starts a fresh scheduler.
    monkeypatch.setattr(engine, "step", recorder.real_step)
    assert run(engine.agenerate(messages=SHORT, params=params)) == expected
    engine.shutdown()


# --- KV-cache memory -------------------------------------------------------------------------------


def cache_bytes(engine: DiffusionEngine, messages, params: SamplingParams) -> int:
    return engine.new_request(messages=messages, params=params).kv_cache_bytes


def test_requests_wait_for_kv_cache_memory_and_uncached_ones_do_not(fixture_engine, monkeypatch):
    cached = SamplingParams(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="dual")
    plain = SamplingParams(gen_length=32, num_denoising_steps=16)
    one_cache = cache_bytes(fixture_engine, SHORT, cached)
    assert one_cache == fixture_engine.model.kv_bytes(len(fixture_engine.prompt_ids(Prompt.chat(SHORT))) + 32)
    engine = fresh(fixture_engine, max_batch_size=8, max_wait_ms=200, kv_cache_budget_bytes=one_cache * 3 // 2)
    recorder = StepRecorder(engine)
    reserved_during_steps: list[int] = []

    def step(requests):
        reserved_during_steps.append(engine.stats.snapshot()["dllm_kv_cache_bytes"])
        return recorder(requests)

    monkeypatch.setattr(engine, "step", step)
    order = [plain, cached, plain, cached, cached]  # first come, first served: the second cached one waits

    async def concurrently():
        return await asyncio.gather(*(engine.agenerate(messages=SHORT, params=p) for p in order))

    results = run(concurrently())
    engine.shutdown()
    assert results == [fixture_engine.generate(messages=SHORT, params=p) for p in order]
    assert max(reserved_during_steps) == one_cache  # never two caches at once
    assert max(sum(r.uses_kv_cache for r in batch) for batch in recorder.batches) == 1
    assert any(len(batch) == 3 for batch in recorder.batches)  # the uncached ones ran beside the first cache
    assert engine.stats.snapshot()["dllm_kv_cache_bytes"] == 0


def test_caches_that_fill_the_budget_exactly_run_together(fixture_engine, monkeypatch):
    cached = SamplingParams(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="prefix")
    engine = fresh(fixture_engine, kv_cache_budget_bytes=2 * cache_bytes(fixture_engine, SHORT, cached))
    steps = StepByStep(engine)
    monkeypatch.setattr(engine, "step", steps)

    async def scenario():
        first = asyncio.create_task(engine.agenerate(messages=SHORT, params=cached))
        await asyncio.to_thread(steps.wait_for_arrival, 1)  # running, its first step held
        second = asyncio.create_task(engine.agenerate(messages=SHORT, params=cached))
        await until(lambda: snapshot_has(engine, dllm_requests_waiting=1))
        steps.run_freely()  # the second is admitted at the next iteration: 2 caches = the whole budget
        return await asyncio.gather(first, second)

    results = run(scenario())
    engine.shutdown()
    assert results == [fixture_engine.generate(messages=SHORT, params=cached)] * 2
    sizes = [len(batch) for batch in steps.batches]
    assert sizes[0] == 1 and 2 in sizes  # alone at first, then together (with one byte less, never)


def test_a_cache_larger_than_the_whole_budget_is_refused_up_front(fixture_engine):
    cached = SamplingParams(gen_length=32, kv_cache="prefix")
    engine = fresh(fixture_engine, kv_cache_budget_bytes=cache_bytes(fixture_engine, SHORT, cached) - 1)
    with pytest.raises(InvalidParameter) as error:
        run(engine.agenerate(messages=SHORT, params=cached))
    assert error.value.field == "kv_cache" and "MiB" in str(error.value)
    run(engine.agenerate(messages=SHORT, params=SamplingParams(gen_length=32)))  # without a cache it fits
    engine.shutdown()


def test_cancelled_and_finished_requests_give_their_cache_back(fixture_engine, monkeypatch):
    cached = SamplingParams(gen_length=64, block_length=16, num_denoising_steps=64, kv_cache="prefix")
    engine = fresh(fixture_engine, kv_cache_budget_bytes=cache_bytes(fixture_engine, MEDIUM, cached) * 3 // 2)
    created = []
    real_new_request = engine.new_request

    def new_request(*args, **kwargs):
        created.append(real_new_request(*args, **kwargs))
        return created[-1]

    monkeypatch.setattr(engine, "new_request", new_request)

    async def scenario():
        events = engine.astream(messages=MEDIUM, params=cached)
        await anext(events)
        await anext(events)
        assert created[0].kv_cache_tensor is not None
        await events.aclose()  # a client disconnecting mid-stream
        await until(lambda: engine.stats.snapshot()["dllm_requests_cancelled_total"] == 1)
        assert engine.stats.snapshot()["dllm_kv_cache_bytes"] == 0
        # Had the cancelled request kept its reservation, this one could never be admitted.
        return await engine.agenerate(messages=MEDIUM, params=cached)

    result = run(scenario())
    engine.shutdown()
    assert result == fixture_engine.generate(messages=MEDIUM, params=cached)
    assert created[0].kv_cache_tensor is None and created[1].kv_cache_tensor is None
    assert engine.stats.snapshot()["dllm_kv_cache_bytes"] == 0


# --- configuration, statistics, lazy start ----------------------------------------------------------


def test_scheduler_config_from_env():
    assert SchedulerConfig.from_env({}) == SchedulerConfig(max_batch_size=8, max_waiting=256, max_wait_ms=0.0)
    config = SchedulerConfig.from_env({"DLLM_MAX_BATCH_SIZE": "16", "DLLM_MAX_WAITING": "0", "DLLM_MAX_WAIT_MS": "2.5"})
    assert config == SchedulerConfig(max_batch_size=16, max_waiting=0, max_wait_ms=2.5)
    budget = SchedulerConfig.from_env({"DLLM_KV_CACHE_BUDGET_MB": "64"}).kv_cache_budget_bytes
    assert budget == 64 * 2**20
    for env, message in [
        ({"DLLM_MAX_BATCH_SIZE": "eight"}, "DLLM_MAX_BATCH_SIZE='eight': must be an integer"),
        ({"DLLM_MAX_BATCH_SIZE": "0"}, "DLLM_MAX_BATCH_SIZE='0': .*max_batch_size must be an integer ≥ 1"),
        ({"DLLM_MAX_WAITING": "1.5"}, "DLLM_MAX_WAITING='1.5': must be an integer"),
        ({"DLLM_MAX_WAIT_MS": "-1"}, "DLLM_MAX_WAIT_MS='-1': .*max_wait_ms must be a finite number ≥ 0"),
        ({"DLLM_MAX_WAIT_MS": "inf"}, "DLLM_MAX_WAIT_MS='inf': .*max_wait_ms must be a finite number ≥ 0"),
        ({"DLLM_KV_CACHE_BUDGET_MB": "1.5"}, "DLLM_KV_CACHE_BUDGET_MB='1.5': must be an integer"),
        ({"DLLM_KV_CACHE_BUDGET_MB": "0"}, "DLLM_KV_CACHE_BUDGET_MB='0': .*must be a positive integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            SchedulerConfig.from_env(env)


def test_kv_cache_budget_defaults_to_a_share_of_the_device_memory(fixture_engine):
    engine = fresh(fixture_engine)  # no budget given
    budget = engine.scheduler_config.kv_cache_budget_bytes
    assert budget == default_kv_cache_budget(torch.device("cpu")) > 0
    assert engine.stats.snapshot()["dllm_kv_cache_budget_bytes"] == budget


def test_engine_reads_scheduler_config_from_env(fixture_engine, monkeypatch):
    monkeypatch.setenv("DLLM_MAX_BATCH_SIZE", "3")
    engine = DiffusionEngine(fixture_engine.model, fixture_engine.tokenizer, fixture_engine.device, "tiny")
    assert engine.scheduler_config.max_batch_size == 3
    monkeypatch.setenv("DLLM_MAX_BATCH_SIZE", "three")
    with pytest.raises(ValueError, match="DLLM_MAX_BATCH_SIZE"):
        DiffusionEngine.from_pretrained(FIXTURE_DIR)


def test_prometheus_text_and_lazy_scheduler_start(fixture_engine):
    engine = fresh(fixture_engine)
    assert engine._scheduler is None  # no thread until the first request
    params = SamplingParams(gen_length=16, num_denoising_steps=16)
    result = run(engine.agenerate(messages=SHORT, params=params))
    assert isinstance(result, GenerationResult) and engine._scheduler is not None
    text = engine.stats.prometheus_text()
    engine.shutdown()

    for name, kind in [
        ("dllm_requests_running", "gauge"),
        ("dllm_requests_waiting", "gauge"),
        ("dllm_requests_total", "counter"),
        ("dllm_requests_cancelled_total", "counter"),
        ("dllm_forward_passes_total", "counter"),
        ("dllm_tokens_committed_total", "counter"),
        ("dllm_batch_size", "histogram"),
        ("dllm_request_duration_seconds", "histogram"),
    ]:
        assert f"# TYPE {name} {kind}\n" in text
        assert f"# HELP {name} " in text
    lines = text.splitlines()
    assert "dllm_requests_total 1" in lines
    assert f"dllm_forward_passes_total {result.num_forward_passes}" in lines
    assert 'dllm_batch_size_bucket{le="1"} ' + str(result.num_forward_passes) in lines
    assert 'dllm_batch_size_bucket{le="+Inf"} ' + str(result.num_forward_passes) in lines
    assert "dllm_batch_size_count " + str(result.num_forward_passes) in lines
    assert "dllm_request_duration_seconds_count 1" in lines
    assert text.endswith("\n")
