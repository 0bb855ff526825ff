"""LLaDA2: the cached engine against the official uncached loop, and batched against sequential requests.

In one process, on the llada2-tiny fixture model and on a mid-sized random LLaDA2 (benchmarks/llada2_shapes.py:
hidden 256, 4 layers, 16 experts, so that arithmetic and not per-op overhead shows on a CPU):

1. **Cache**, batch 1: the engine (exact block KV cache: a step computes the current block against the cached
   prompt and finished blocks, the LM head at the block's candidates only) against
   benchmarks/llada2_reference_loop.py (the official `generate()`: every forward runs the whole prefix
   [0, (b+1)·B) with the block-causal mask, the LM head at every position), at the same settings, gen 256 and
   blocks of 32, with a short and a long prompt; LLaDA2.0 at one token per forward and LLaDA2.1 with editing.
   Before a row counts, the engine's canvas and forward count must equal the loop's. The two are timed in
   alternation, request by request, so background load hits both alike.
2. **Batching**: N concurrent requests through the engine's scheduler (they share forwards) against the same N
   awaited one after another; throughput is canvas tokens per second of wall time.

EOS never ends a request here (the models' random or near-random weights put EOS anywhere, and LLaDA2.0 stops
at the first block holding one whatever `early_exit` says): every request computes its whole canvas, so the
work is fixed and identical in every row. Times are medians over the rounds (and the fastest, the least
disturbed on a shared machine); the machine and its load average are printed with the results.

Usage: python benchmarks/llada2.py [--repeats 3] [--gen-length 256] [--prompts 16 224] [--concurrency 8]
       [--models fixture mid] [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.kv_cache import timed_generations  # noqa: E402
from benchmarks.llada2_reference_loop import reference_generate  # noqa: E402
from benchmarks.llada2_shapes import LLADA2_MID, TokenIds, parameter_counts, random_llada2, random_prompt  # noqa: E402
from engine import DiffusionEngine, SamplingParams, SchedulerConfig  # noqa: E402
from engine.loading import load_model  # noqa: E402
from tests.fixture_paths import LLADA2_FIXTURE_DIR  # noqa: E402

BLOCK = 32


@dataclass(frozen=True)
class Setting:
    """One sampler setting in the engine's names and in the official generate()'s."""

    name: str
    engine: dict
    official: dict

    @classmethod
    def llada20_one_token(cls, gen: int) -> Setting:
        # threshold None: the quota alone decides, as a threshold no confidence exceeds would
        engine = dict(num_denoising_steps=gen, early_exit=False)
        return cls("2.0, 1 token/forward", engine, dict(steps=BLOCK, threshold=None))

    @classmethod
    def llada21_editing(cls) -> Setting:
        engine = dict(confidence_threshold=0.7, editing_threshold=0.5, early_exit=False)
        return cls("2.1, τ 0.7, edit 0.5", engine, dict(threshold=0.7, editing_threshold=0.5))


def load(name: str) -> torch.nn.Module:
    if name == "fixture":
        return load_model(LLADA2_FIXTURE_DIR, "cpu", torch.float32)
    if name == "mid":
        return random_llada2(LLADA2_MID, "cpu", torch.float32, seed=0)
    raise ValueError(f"--models: unknown model {name!r} (fixture or mid)")


class PositionCounter:
    """Positions the model computes (input ids over all forwards): the arithmetic the cache removes."""

    def __init__(self, model):
        self.positions = 0
        self._handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.positions += args[0].numel()

    def remove(self) -> None:
        self._handle.remove()


@dataclass
class CacheRow:
    model: str
    setting: str
    prompt: int
    forwards: int
    engine_positions: int  # computed by the model over the request (all forwards)
    official_positions: int
    engine_s: float  # median
    official_s: float
    engine_fastest_s: float
    official_fastest_s: float
    speedup: float  # official / engine, medians
    speedup_fastest: float


def cache_rows(model_name, engine: DiffusionEngine, settings, prompts, gen, repeats) -> list[CacheRow]:
    model, config = engine.model, engine.model.config
    rows = []
    for setting in settings:
        for length in prompts:
            ids = random_prompt(config, length, seed=length)
            params = SamplingParams(gen_length=gen, block_length=BLOCK, **setting.engine)
            official = dict(gen_length=gen, block_length=BLOCK, mask_id=config.mask_token_id, eos_id=None)
            official.update(setting.official)
            times = {"engine": [], "official": []}
            for repeat in range(repeats):
                order = ("official", "engine") if repeat % 2 else ("engine", "official")
                seen = {}
                for which in order:
                    counter = PositionCounter(model)
                    start = time.perf_counter()
                    if which == "engine":
                        result = engine.generate(prompt_token_ids=ids, params=params)
                        canvas, forwards = result.canvas_ids, result.num_forward_passes
                    else:
                        reference = reference_generate(model, ids, **official)
                        canvas, forwards = reference.canvas[length : length + gen], reference.num_forwards
                    times[which].append(time.perf_counter() - start)
                    counter.remove()
                    seen[which] = (counter.positions, canvas, forwards)
                (e_pos, e_canvas, e_fwd), (o_pos, o_canvas, o_fwd) = seen["engine"], seen["official"]
                if e_canvas != o_canvas or e_fwd != o_fwd:
                    raise AssertionError(
                        f"{model_name}, {setting.name}, prompt {length}: the engine differs from the official loop "
                        f"({e_fwd} vs {o_fwd} forwards, {sum(a != b for a, b in zip(e_canvas, o_canvas))} tokens)"
                    )
            e_med, o_med = statistics.median(times["engine"]), statistics.median(times["official"])
            e_min, o_min = min(times["engine"]), min(times["official"])
            rows.append(
                CacheRow(
                    model_name,
                    setting.name,
                    length,
                    e_fwd,
                    engine_positions=e_pos,
                    official_positions=o_pos,
                    engine_s=e_med,
                    official_s=o_med,
                    engine_fastest_s=e_min,
                    official_fastest_s=o_min,
                    speedup=o_med / e_med,
                    speedup_fastest=o_min / e_min,
                )
            )
            print(format_cache_row(rows[-1]), flush=True)
    return rows


@dataclass
class BatchRow:
    model: str
    setting: str
    concurrency: int
    prompt: int
    sequential_tok_s: float  # median over rounds
    batched_tok_s: float
    speedup: float  # of the medians
    best_speedup: float  # fastest batched round over fastest sequential round
    mean_batch: float  # request-steps per forward when batched


def batch_row(model_name, model, tokenizer, setting, concurrency, prompt, gen, repeats) -> BatchRow:
    # Two engines on the same model: the batched one waits (up to 200 ms, or until all N are in) so that the
    # burst starts as one batch; the sequential one never waits, or every lone request would pay that wait.
    cpu = torch.device("cpu")
    together = DiffusionEngine(
        model, tokenizer, cpu, model_name, SchedulerConfig(max_batch_size=concurrency, max_wait_ms=200)
    )
    alone = DiffusionEngine(model, tokenizer, cpu, model_name, SchedulerConfig(max_batch_size=concurrency))
    forwards = lambda engine: engine.stats.snapshot()["dllm_forward_passes_total"]  # noqa: E731
    try:
        # Prompts of different lengths (prompt ± 25%): rows at different blocks and cache lengths share forwards.
        lengths = [prompt + (i * prompt // 2) // max(concurrency - 1, 1) - prompt // 4 for i in range(concurrency)]
        prompts = [random_prompt(model.config, n, seed=100 + i) for i, n in enumerate(lengths)]
        params = SamplingParams(gen_length=gen, block_length=BLOCK, **setting.engine)
        asyncio.run(timed_generations(together, prompts[:2], params, concurrent=True))  # warm-up
        sequential, batched, shared = [], [], []
        for _ in range(repeats):
            before = forwards(alone)
            sequential.append(asyncio.run(timed_generations(alone, prompts, params, concurrent=False)))
            request_steps = forwards(alone) - before  # one request-step per forward
            before = forwards(together)
            batched.append(asyncio.run(timed_generations(together, prompts, params, concurrent=True)))
            shared.append(request_steps / (forwards(together) - before))
    finally:
        together.shutdown()
        alone.shutdown()
    tokens = concurrency * gen
    seq, bat = statistics.median(sequential), statistics.median(batched)
    return BatchRow(model_name, setting.name, concurrency, prompt, tokens / seq, tokens / bat, seq / bat,
                    min(sequential) / min(batched), statistics.median(shared))  # fmt: skip


def warm_up(engine: DiffusionEngine, model) -> None:
    """The first forwards of a process are slower (allocator, kernel selection): run each path once untimed."""
    ids = random_prompt(model.config, 40, seed=1)
    engine.generate(prompt_token_ids=ids, params=SamplingParams(gen_length=BLOCK, block_length=BLOCK))
    mask_id = model.config.mask_token_id
    reference_generate(model, ids, gen_length=BLOCK, block_length=BLOCK, mask_id=mask_id, eos_id=None)


def format_cache_row(r: CacheRow) -> str:
    return (
        f"| {r.model:7} | {r.setting:22} | {r.prompt:6} | {r.forwards:8} | {r.official_positions / r.forwards:10.0f} "
        f"| {r.engine_positions / r.forwards:9.0f} | {r.official_s * 1e3:10.0f} | {r.engine_s * 1e3:9.0f} "
        f"| **{r.speedup:.2f}×** | {r.speedup_fastest:.2f}× |"
    )


CACHE_HEADER = (
    "| model   | setting                | prompt | forwards | official positions/fwd | engine positions/fwd "
    "| official ms | engine ms | × (median) | × (fastest) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)
BATCH_HEADER = (
    "| model | setting | concurrent | prompt | sequential tok/s | batched tok/s | × (median) | × (fastest) "
    "| mean batch |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def format_batch_row(r: BatchRow) -> str:
    return (
        f"| {r.model} | {r.setting} | {r.concurrency} | {r.prompt} | {r.sequential_tok_s:.0f} | {r.batched_tok_s:.0f} "
        f"| **{r.speedup:.2f}×** | {r.best_speedup:.2f}× | {r.mean_batch:.1f} |"
    )


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["fixture", "mid"], help="fixture (llada2-tiny) and/or mid")
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument(
        "--prompts",
        type=int,
        nargs="+",
        default=[16, 224],
        help="prompt lengths of part 1 (≤ 256: the fixture has 512 positions)",
    )
    parser.add_argument("--batch-prompt", type=int, default=64, help="mean prompt length of part 2")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per row of part 1 (median, fastest)")
    parser.add_argument("--batch-rounds", type=int, default=3, help="rounds of each mode in part 2")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the CPU service's default)")
    parser.add_argument("--skip-batching", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every number here")
    args = parser.parse_args()
    if args.gen_length % BLOCK:
        parser.error(f"--gen-length must be a multiple of the block length {BLOCK}")

    torch.set_num_threads(args.threads)
    host = machine()
    load_before = load_average()
    print(f"machine: {host['cpu']}, {host['cores']} cores, torch {host['torch']}, {host['threads']} torch thread(s), "
          f"float32; load average (1/5/15 min) at start: {load_before}")  # fmt: skip
    gen = args.gen_length
    settings = [Setting.llada20_one_token(gen), Setting.llada21_editing()]
    models = {name: load(name) for name in args.models}
    for name, model in models.items():
        total, active = parameter_counts(model.config)
        c = model.config
        print(f"model {name}: hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_experts} experts "
              f"(top {c.num_experts_per_tok}), vocab {c.vocab_size}: {total / 1e6:.2f} M parameters, "
              f"{active / 1e6:.2f} M active per token")  # fmt: skip

    print(f"\n1. exact block cache (engine) vs the official uncached loop: gen {gen}, block {BLOCK}, batch 1, "
          f"{args.repeats} rounds in alternation; tokens and forwards checked identical in each")  # fmt: skip
    print(CACHE_HEADER)
    caches = []
    for name, model in models.items():
        tokenizer = TokenIds(model.config)
        engine = DiffusionEngine(model, tokenizer, torch.device("cpu"), name)
        warm_up(engine, model)
        try:
            caches += cache_rows(name, engine, settings, args.prompts, gen, args.repeats)
        finally:
            engine.shutdown()

    batches = []
    if not args.skip_batching:
        print(f"\n2. batching: {args.concurrency} concurrent requests vs one after another, gen {gen}, block {BLOCK}, "
              f"prompts {args.batch_prompt} ± 25%, {args.batch_rounds} rounds")  # fmt: skip
        print(BATCH_HEADER)
        for name, model in models.items():
            tokenizer = TokenIds(model.config)
            for setting in settings:
                row = batch_row(
                    name, model, tokenizer, setting, args.concurrency, args.batch_prompt, gen, args.batch_rounds
                )
                batches.append(row)
                print(format_batch_row(row), flush=True)
    load_after = load_average()
    print(f"\nload average (1/5/15 min) at the end: {load_after}")
    if args.json:
        report = {"machine": host, "load_average": {"start": load_before, "end": load_after}, "gen_length": gen,
                  "cache": [asdict(r) for r in caches], "batching": [asdict(r) for r in batches]}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
