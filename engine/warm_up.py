"""Startup warm-up: one step of every configured shape bucket before the first request (engine.warm_up).

With the compiled forward (engine/compiled.py) each bucket's graph is compiled the first time a step of that
shape runs: tens of seconds per shape on a CPU, cold. Warm-up runs those steps at startup, with synthetic
requests, so that the first real request is not the one that pays; readiness stays false meanwhile.
PyTorch's on-disk cache keeps the compiled code, so a restart only re-traces.

What a plan covers: for every batch bucket and every cache mode, the block's first forward and (with a cache)
a cached step, at one prompt length and canvas; with the prefix cache, in every block (its cached query
runs to the canvas's end, so it shrinks block by block). Only forwards of at most 64 positions per row run
compiled (engine/compiled.py's `COMPILED_SPAN`): the longer ones a plan steps run eagerly and compile nothing.
Compiled, a plan also steps a whole short canvas (an 8-token prompt, a canvas of 32 and of 64 positions), the
shape of a short question with a short answer and no cache. A request of another length shares a bucket when
its lengths round to the same ones (engine/compiled.py's `length_bucket`); one that does not compiles its
shapes when first seen, and /metrics counts that (dllm_compile_recompiles_total).

Settings (read by `WarmUpPlan.from_env`): DLLM_WARMUP_BATCH_SIZES (comma-separated; default the powers of
two up to max_batch_size, and max_batch_size), DLLM_WARMUP_KV_CACHE (default "none,dual"),
DLLM_WARMUP_PROMPT_TOKENS (64), DLLM_WARMUP_GEN_LENGTH (256), DLLM_WARMUP_MAX_LENGTH (the KV pool's reserved
canvas; default the model's maximum sequence length, at most 1024).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.compiled import static_shapes_of
from engine.env_settings import ascii_int, comma_list, settings_from_env
from engine.errors import InvalidParameter
from engine.kv_slots import kv_slots
from engine.params import SamplingParams

WARM_UP_BLOCK = 32
SHORT_PROMPT = 8  # the prompt of the short-canvas warm-up requests
MAX_RESERVED_LENGTH = 1024


def default_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    sizes = {1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size}
    return tuple(sorted(sizes | {max_batch_size}))


@dataclass(frozen=True)
class WarmUpPlan:
    batch_sizes: tuple[int, ...] | None = None  # None: default_batch_sizes(max_batch_size)
    kv_cache: tuple[str, ...] = ("none", "dual")
    prompt_tokens: int = 64
    gen_length: int = 256
    max_length: int | None = None  # None: min(model's maximum sequence length, MAX_RESERVED_LENGTH)

    ENV_VARS = {
        "batch_sizes": "DLLM_WARMUP_BATCH_SIZES",
        "kv_cache": "DLLM_WARMUP_KV_CACHE",
        "prompt_tokens": "DLLM_WARMUP_PROMPT_TOKENS",
        "gen_length": "DLLM_WARMUP_GEN_LENGTH",
        "max_length": "DLLM_WARMUP_MAX_LENGTH",
    }

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "gen_length", "max_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"WarmUpPlan.{name} must be a positive integer, got {value!r}")
        if self.batch_sizes is not None and not all(isinstance(b, int) and b >= 1 for b in self.batch_sizes):
            raise ValueError(f"WarmUpPlan.batch_sizes must be positive integers, got {self.batch_sizes!r}")
        if not set(self.kv_cache) <= {"none", "prefix", "dual"}:
            raise ValueError(f"WarmUpPlan.kv_cache must name none, prefix or dual, got {self.kv_cache!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WarmUpPlan:
        parsers = {"kv_cache": comma_list(str), "batch_sizes": comma_list(ascii_int)}
        return settings_from_env(cls, parsers, environ)


def run_warm_up(engine, plan: WarmUpPlan) -> None:
    """Step synthetic requests through each bucket, on the calling thread (engine.warm_up gives it one of its own)."""
    batch_sizes = plan.batch_sizes or default_batch_sizes(engine.scheduler_config.max_batch_size)
    static = static_shapes_of(engine.model)
    limit = engine.max_sequence_length
    if static is not None:
        static.batch_sizes = tuple(sorted(set(batch_sizes)))
        reserved = min(plan.max_length or min(limit, MAX_RESERVED_LENGTH), limit)
        slots = kv_slots(engine.model)
        slots.reserve(max(batch_sizes), reserved + 1)
        engine.model.rotary.fill(slots.width, engine.device)  # cached forwards read it up to the pool's width
    gen = min(plan.gen_length, limit - 1)
    block = min(WARM_UP_BLOCK, gen)
    prompt = engine.tokenizer.encode_prompt("warm up " * plan.prompt_tokens)[: min(plan.prompt_tokens, limit - gen)]
    for size in sorted(set(batch_sizes)):
        for mode in plan.kv_cache:
            params = SamplingParams(
                gen_length=gen,
                block_length=block,
                num_denoising_steps=2 * (gen // block),  # two per block: its first forward, then a cached one
                kv_cache=mode,
                early_exit=False,
            )
            # none: the whole canvas, the same shape at every step; dual: the block's first forward and a
            # cached step, the same for every block; prefix: every block, as its cached query (the block to the
            # canvas's end) shrinks through the length buckets.
            steps = {"none": 1, "dual": 2, "prefix": params.num_denoising_steps}[mode]
            _step_through(engine, size, prompt, params, steps)
        if static is not None:  # short canvases (a short prompt and answer) run compiled too, uncached or not
            for canvas in range(32, static.max_span + 1, 32):  # the longest canvas of each length bucket
                short = canvas - SHORT_PROMPT
                params = SamplingParams(gen_length=short, block_length=short, num_denoising_steps=1, early_exit=False)
                _step_through(engine, size, prompt[:SHORT_PROMPT], params, 1)


def _step_through(engine, size: int, prompt: list[int], params: SamplingParams, steps: int) -> None:
    """`steps` steps of `size` synthetic requests, then their resources back; a mode the family refuses is skipped."""
    try:
        requests = [engine.new_request(prompt_token_ids=prompt, params=params) for _ in range(size)]
    except InvalidParameter:  # a mode this family refuses (or a plan too large for its budget)
        return
    try:
        for _ in range(steps):
            engine.step(requests)
    finally:
        for request in requests:
            request.release()
