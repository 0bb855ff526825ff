"""The compiled static-shape forward (engine/compiled.py), its warm-up (engine/warm_up.py) and their settings.

Compiling takes tens of seconds per shape on a CPU, so only the test marked slow compiles; the fast ones run
the same bucketing and warm-up code eagerly, or check what is refused before anything compiles.
"""

from __future__ import annotations

import dataclasses
import threading
import zipfile

import pytest
import torch

from engine import DiffusionEngine, SamplingParams, SchedulerConfig
from engine.compiled import COMPILED_SPAN, StaticShapes, length_bucket
from engine.kv_slots import kv_slots
from engine.model import KVFrame, LogitIndex
from engine.warm_up import WarmUpPlan, default_batch_sizes
from server.engine_setup import check_engine_configuration
from tests import test_dream_kv_cache, test_dream_reference, test_kv_cache, test_reference_generate
from tests.fixture_paths import DREAM_FIXTURE_DIR, FIXTURE_DIR

PROMPTS = [list(range(5, 13)), list(range(20, 31))]
TINY_PLAN = WarmUpPlan(batch_sizes=(1, 2), kv_cache=("none", "dual"), prompt_tokens=8, gen_length=16)


def test_lengths_round_up_to_few_buckets():
    assert [length_bucket(n) for n in (1, 32, 33, 64, 65, 128, 129, 300)] == [32, 32, 64, 64, 128, 128, 256, 384]
    assert default_batch_sizes(8) == (1, 2, 4, 8) and default_batch_sizes(6) == (1, 2, 4, 6)


def test_a_batch_runs_in_the_smallest_bucket_that_holds_it():
    static = StaticShapes.__new__(StaticShapes)  # the bucket rule alone: nothing compiled
    static.batch_sizes = (1, 2, 4, 8)
    assert [static.batch(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 9]  # past the last: its own size
    assert StaticShapes.candidates(3, 32) == 32 and StaticShapes.candidates(40, 384) == 64


class EagerBuckets(StaticShapes):
    """The compiled engine's bucketing with an eager forward in place of the graph: nothing compiles, and the
    span of every forward that takes the compiled path is recorded."""

    def __init__(self, on_cuda: bool = False):
        self.batch_sizes, self.max_span, self.on_cuda = (1, 2, 4, 8), COMPILED_SPAN, on_cuda
        self.shapes, self.recompiles, self.spans, self.key_windows = set(), 0, [], []

    def __call__(self, model, input_ids, attention_mask, logit_index, kv):
        self.spans.append(input_ids.shape[1])
        if kv is not None:
            self.key_windows.append(kv.key_mask.shape[1])
        logits = model.forward(input_ids, attention_mask, logit_index=LogitIndex(logit_index.columns), kv=kv)
        return logits if logit_index.real is None else logits[logit_index.real]


def test_only_short_forwards_take_the_compiled_path_and_its_padding_keeps_every_token():
    """Forwards of at most COMPILED_SPAN positions per row go through the buckets (padded batch, lengths, key
    window, candidates); whole long canvases run eagerly. Either way the tokens are the eager engine's."""
    eager = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    bucketed = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    buckets = EagerBuckets()
    object.__setattr__(bucketed.model, "_static_shapes", buckets)
    long_dual = SamplingParams(gen_length=96, block_length=32, kv_cache="dual", temperature=0.0, early_exit=False)
    short_none = SamplingParams(gen_length=20, block_length=20, temperature=0.0, early_exit=False)
    long_none = SamplingParams(gen_length=96, block_length=32, temperature=0.0, early_exit=False)
    spans = {}
    for name, params in (("long dual", long_dual), ("short none", short_none), ("long none", long_none)):
        before = len(buckets.spans)
        for prompts in ([PROMPTS[0]], PROMPTS):  # alone, and two rows of different lengths together
            outputs = []
            for engine in (eager, bucketed):
                requests = [engine.new_request(prompt_token_ids=p, params=params) for p in prompts]
                while not all(r.finished for r in requests):
                    engine.step([r for r in requests if not r.finished])
                outputs.append([list(r.generated) for r in requests])
                for r in requests:
                    r.release()
            assert outputs[0] == outputs[1], name
        spans[name] = set(buckets.spans[before:])
    assert spans == {"long dual": {32}, "short none": {32}, "long none": set()}
    for engine in (eager, bucketed):
        engine.shutdown()


def test_a_compiled_cached_step_reads_only_its_canvases_keys_on_cpu_and_the_whole_pool_on_cuda():
    """On CPU the graph's key window is the longest canvas of the step (a symbolic dimension: one graph for every
    canvas length); on CUDA the pool's whole width (a static shape a captured graph replays). Either way every
    token is the eager engine's."""
    params = SamplingParams(gen_length=64, block_length=32, kv_cache="dual", temperature=0.0, early_exit=False)
    canvases = []
    for on_cuda in (False, True):
        engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
        buckets = EagerBuckets(on_cuda)
        object.__setattr__(engine.model, "_static_shapes", buckets)
        requests = [engine.new_request(prompt_token_ids=p, params=params) for p in PROMPTS]
        pool_widths = set()
        while not all(r.finished for r in requests):
            engine.step([r for r in requests if not r.finished])
            if kv_slots(engine.model).width:  # 0 once the last request has left
                pool_widths.add(kv_slots(engine.model).width)
        canvases.append([r.result.canvas_ids for r in requests])
        longest = max(len(p) for p in PROMPTS) + 64
        assert len(pool_widths) == 1 and max(pool_widths) > longest  # the pool is wider than the canvases
        expected = pool_widths if on_cuda else {longest}
        assert set(buckets.key_windows) == expected, on_cuda
        engine.shutdown()
    eager = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    assert canvases[0] == canvases[1] == [eager.generate(prompt_token_ids=p, params=params).canvas_ids for p in PROMPTS]
    eager.shutdown()


def test_compiled_warm_up_also_covers_short_whole_canvases():
    """A short question with a short answer and no cache is a whole canvas of 32 or 64 positions: compiled, so
    warm-up steps one of each bucket (besides the plan's own canvas, 24 positions here)."""
    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    buckets = EagerBuckets()
    object.__setattr__(engine.model, "_static_shapes", buckets)
    engine.warm_up(dataclasses.replace(TINY_PLAN, batch_sizes=(1,)))
    # none: the plan's canvas (bucket 32); dual: its first forward and a cached step; then canvases 32 and 64.
    assert buckets.spans == [32, 32, 32, 32, 64]
    engine.shutdown()


def test_warm_up_settings_are_read_and_checked():
    plan = WarmUpPlan.from_env({"DLLM_WARMUP_BATCH_SIZES": "1, 4", "DLLM_WARMUP_KV_CACHE": "dual"})
    assert plan.batch_sizes == (1, 4) and plan.kv_cache == ("dual",) and plan.gen_length == 256
    for var, raw in (("DLLM_WARMUP_KV_CACHE", "dual,fast"), ("DLLM_WARMUP_GEN_LENGTH", "0"),
                     ("DLLM_WARMUP_BATCH_SIZES", "1,x"), ("DLLM_WARMUP_GEN_LENGTH", "٣٢")):  # fmt: skip
        with pytest.raises(ValueError, match=var):
            WarmUpPlan.from_env({var: raw})


def test_compile_with_quantized_weights_is_refused_at_configuration_check(monkeypatch):
    monkeypatch.setenv("DLLM_MODEL", str(FIXTURE_DIR))
    monkeypatch.setenv("DLLM_COMPILE", "1")
    monkeypatch.setenv("DLLM_QUANTIZE", "int8")
    with pytest.raises(ValueError, match="DLLM_COMPILE=1 with DLLM_QUANTIZE"):
        check_engine_configuration()


def test_warm_up_steps_on_a_thread_of_its_own_and_raises_what_it_raised():
    """Not on the caller's thread, which would keep an OpenMP team alive beside the scheduler's (engine.py,
    `_on_a_thread_of_its_own`); a failing step still reaches the caller."""
    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    threads = set()
    real_step = engine.step

    def step(requests):
        threads.add(threading.get_ident())
        return real_step(requests)

    engine.step = step
    engine.warm_up(dataclasses.replace(TINY_PLAN, batch_sizes=(1,)))
    assert threads and threading.get_ident() not in threads

    def failing(requests):
        raise RuntimeError("a step failed")

    engine.step = failing
    with pytest.raises(RuntimeError, match="a step failed"):
        engine.warm_up(dataclasses.replace(TINY_PLAN, batch_sizes=(1,)))
    assert not engine.warming_up
    engine.shutdown()


def test_eager_warm_up_steps_every_bucket_reports_its_time_and_leaves_nothing_behind():
    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    seen = []
    real_step = engine.step

    def step(requests):
        assert not engine.ready  # readiness is false for the whole warm-up
        seen.append((len(requests), requests[0].params.kv_cache, requests[0].block_step))
        return real_step(requests)

    engine.step = step
    seconds = engine.warm_up(TINY_PLAN)
    assert engine.ready and seconds > 0
    assert engine.stats.snapshot()["dllm_warm_up_seconds"] == round(seconds, 3)
    # Every bucket: the first forward, and with a cache one cached step after it.
    assert seen == [(1, "none", 0), (1, "dual", 0), (1, "dual", 1), (2, "none", 0), (2, "dual", 0), (2, "dual", 1)]
    assert kv_slots(engine.model).live == 0 and kv_slots(engine.model).pool is None  # eager: nothing reserved
    assert engine.stats.snapshot()["dllm_compiled_shapes"] == 0


def test_prefix_warm_up_steps_every_block_because_its_cached_query_shrinks_block_by_block():
    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False)
    seen = []
    real_step = engine.step

    def step(requests):
        start, end = requests[0].forward_span()
        seen.append((requests[0].block, requests[0].block_step, end - start))
        return real_step(requests)

    engine.step = step
    engine.warm_up(WarmUpPlan(batch_sizes=(1,), kv_cache=("prefix",), prompt_tokens=8, gen_length=96))
    # Three blocks of 32, each its first forward (the whole canvas) and a cached step over the block and
    # everything after it: 96, 64 and 32 positions, so every query bucket the canvas has is compiled.
    assert [(block, step_in_block) for block, step_in_block, _ in seen] == [(b, s) for b in range(3) for s in (0, 1)]
    assert [span for _, step_in_block, span in seen if step_in_block == 1] == [96, 64, 32]


@pytest.mark.slow
def test_compiled_forward_gives_the_eager_tokens_and_warm_up_covers_its_shapes():
    """Temperature 0, alone and batched, every cache mode: the compiled engine commits the eager engine's tokens;
    after a warm-up of the same shapes, serving compiles nothing new: no new shape, and no known shape whose
    rotary tables grew (as they did when the first call built them)."""
    config = SchedulerConfig(max_batch_size=5)
    eager = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False, scheduler_config=config)
    compiled = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=True, scheduler_config=config)
    assert compiled.compiled and not eager.compiled
    compiled.warm_up(dataclasses.replace(TINY_PLAN, batch_sizes=(1, 2, 3, 4, 5), kv_cache=("none", "prefix", "dual")))
    assert compiled.stats.snapshot()["dllm_compiled_shapes"] > 8
    for mode in ("none", "prefix", "dual"):
        params = SamplingParams(gen_length=16, block_length=8, num_denoising_steps=16, kv_cache=mode)
        for prompt in PROMPTS:
            alone = [engine.generate(prompt_token_ids=prompt, params=params) for engine in (eager, compiled)]
            assert alone[0].canvas_ids == alone[1].canvas_ids
        batches = [[e.new_request(prompt_token_ids=p, params=params) for p in PROMPTS] for e in (eager, compiled)]
        for engine, requests in zip((eager, compiled), batches):
            while not all(r.finished for r in requests):
                engine.step([r for r in requests if not r.finished])
        assert [r.result.canvas_ids for r in batches[0]] == [r.result.canvas_ids for r in batches[1]]
    assert compiled.stats.snapshot()["dllm_compile_recompiles_total"] == 0
    eager.shutdown()
    compiled.shutdown()


@pytest.mark.slow
def test_one_compiled_cached_graph_serves_every_canvas_length():
    """The key window is the graph's one symbolic dimension: after a warm-up at one canvas length, requests of
    other lengths compile nothing (with a static key window each new length was a new graph)."""
    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=True)
    engine.warm_up(dataclasses.replace(TINY_PLAN, batch_sizes=(1,), kv_cache=("dual",)))
    params = SamplingParams(gen_length=16, block_length=8, num_denoising_steps=16, kv_cache="dual", temperature=0.0)
    for prompt_length in (5, 11, 16):  # canvases of 21, 27 and 32 positions: the span buckets warm-up made
        engine.generate(prompt_token_ids=list(range(5, 5 + prompt_length)), params=params)
    assert engine.stats.snapshot()["dllm_compile_recompiles_total"] == 0
    engine.shutdown()


def official_runs(family: str) -> list[tuple[list[int], SamplingParams, list[int]]]:
    """(prompt ids, settings, canvas) of every official run recorded for a fixture model, with the settings the
    reference tests give it: LLaDA's generate() and Fast-dLLM's samplers, or Dream's diffusion_generate() and
    Fast-dLLM's Dream samplers."""
    if family == "llada":
        sources = [(test_reference_generate.CASES, test_reference_generate.reference_params),
                   (test_kv_cache.CASES, test_kv_cache.params_of)]  # fmt: skip
    else:
        sources = [(test_dream_reference.CASES, test_dream_reference.dream_params),
                   (test_dream_kv_cache.CASES, test_dream_kv_cache.params_of)]  # fmt: skip
    return [
        (c["prompt_ids"], settings(c, early_exit=False), c["output_ids"]) for cases, settings in sources for c in cases
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "fixture"), [("llada", FIXTURE_DIR), ("dream", DREAM_FIXTURE_DIR)])
def test_compiled_engine_reproduces_every_official_fixture_run(family, fixture):
    """Issue 26: at temperature 0 the compiled forward gives the official tokens (so eager's) on every fixture
    run, with and without a KV cache, quota and threshold rules."""
    engine = DiffusionEngine.from_pretrained(fixture, device="cpu", compile=True)
    runs = official_runs(family)
    assert len(runs) > 40
    wrong = [i for i, (prompt, params, canvas) in enumerate(runs)
             if engine.generate(prompt_token_ids=prompt, params=params).canvas_ids != canvas]  # fmt: skip
    assert wrong == []
    engine.shutdown()


def cached_step_inputs(model, rows: int = 4, width: int = 128, computed: int = 8):
    """A cached forward's inputs: two batch rows in a pool of `rows` (larger than the frame, so that a pass over
    the whole pool would show), eight computed positions each at their own columns, and the key masks."""
    c = model.config
    generator = torch.Generator().manual_seed(0)
    pool = torch.randn(c.n_layers, 2, rows, c.n_kv_heads, width, c.head_dim, generator=generator)
    input_ids = torch.randint(5, 300, (2, computed), generator=generator)
    columns = torch.stack([torch.arange(20, 20 + computed), torch.arange(40, 40 + computed)])
    key_mask = torch.arange(width)[None, :] < torch.tensor([[60], [90]])
    return input_ids, LogitIndex(torch.arange(computed).repeat(2, 1)), pool, columns, key_mask


@pytest.mark.slow
def test_the_ahead_of_time_graph_writes_the_pool_in_place_and_gives_eagers_logits(tmp_path, monkeypatch):
    """The compiled graph must write the fresh keys and values into the pool itself, where eager writes them:
    its kernels have no pass over the whole pool (a functionalized write clones it and copies it all back per
    call, which makes a compiled step cost the pool's size). The key mask is a slice of a wider one (strided),
    as the graph must not read it as if contiguous. A key window as wide as the pool, outside the exported
    range (the pool keeps a column past every canvas), is refused rather than run."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False).model.eval()
    static = StaticShapes(model)
    input_ids, index, pool, columns, key_mask = cached_step_inputs(model)
    computed = input_ids.shape[1]
    with torch.inference_mode():
        for window in (key_mask[:, :96], key_mask[:, :70]):  # one graph serves both widths
            eager_pool, graph_pool = pool.clone(), pool.clone()
            eager = model.forward(input_ids, logit_index=index, kv=KVFrame(eager_pool, columns, columns, window))
            logits = static(model, input_ids, None, index, KVFrame(graph_pool, columns, columns.clone(), window))
            torch.testing.assert_close(logits, eager, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(graph_pool, eager_pool, rtol=1e-4, atol=1e-4)  # written where eager writes
            assert not torch.equal(graph_pool[:, :, 0, :, 20 : 20 + computed], pool[:, :, 0, :, 20 : 20 + computed])
        with pytest.raises(ValueError, match="a key window of 128 columns, outside the graph's range"):
            static(model, input_ids, None, index, KVFrame(pool, columns, columns, key_mask))
    (graph,) = static._graphs.graphs.values()
    with zipfile.ZipFile(graph.package) as package:
        kernels = [package.read(name).decode() for name in package.namelist() if name.endswith(".cpp")]
    assert kernels and not any(f"{pool.numel()}L" in code for code in kernels)  # no loop over the whole pool


@pytest.mark.slow
def test_a_restart_loads_its_graphs_from_the_disk_cache_without_compiling(tmp_path, monkeypatch):
    """A second process (here: a second model) exports the same graph and finds it on disk: nothing compiles."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    outputs = []
    for attempt in range(2):
        model = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", compile=False).model.eval()
        static = StaticShapes(model)
        input_ids, index, pool, columns, key_mask = cached_step_inputs(model)
        with torch.inference_mode():
            outputs.append(static(model, input_ids, None, index, KVFrame(pool, columns, columns, key_mask[:, :96])))
        if attempt == 0:
            assert len(list((tmp_path / "dllm-aot").glob("*.pt2"))) == 1

            def no_compiling(*args, **kwargs):
                raise AssertionError("compiled again: the disk cache was not used")

            monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiling)
    assert torch.equal(outputs[0], outputs[1])
