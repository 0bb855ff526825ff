"""Approximate KV cache and threshold decoding (Fast-dLLM) on the embedded model: speed, accuracy, batching.

In one process, at gen 256 (or --gen-length) with blocks of 32 (the shape Fast-dLLM reports for LLaDA-8B),
three parts:

1. Speed, interleaved prompt by prompt (each prompt runs every row in turn, rotating the order, so that
   background load hits all rows alike): the official LLaDA loop (benchmarks/reference_loop.py), the engine
   with kv_cache none / prefix / dual at one token per forward, and confidence threshold 0.9 without and
   with the dual cache. Early exit is off in these rows, so every request computes its whole canvas; the
   last row is the recommended serving setting (dual + τ 0.9 + early exit). Before timing, it asserts that
   the engine without a cache reproduces the reference loop's tokens. Besides wall time, the time spent
   inside model forwards is added up: its ratio to "none" is the ceiling of the cache's speedup (what the
   rest of a step, the same in every mode, leaves of it).
2. Accuracy on the held-out eval (default 400 prompts), early exit on (it is lossless): exact match, the
   share of answers identical to kv_cache "none", forwards per request and canvas tokens/s of each row.
3. Batching: 8 concurrent cached requests through the scheduler vs the same 8 one after another, against
   the ceiling a forward sweep measures (8 single cached steps vs one shared step of 8).

Usage: python benchmarks/kv_cache.py [--gen-length 256] [--limit 400] [--timing-prompts 24] [--plot docs/kv_cache.png]
       [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.reference_loop import reference_generate  # noqa: E402
from engine import DiffusionEngine, SamplingParams, SchedulerConfig  # noqa: E402
from scripts.tiny_chat_corpus import heldout_examples  # noqa: E402

BLOCK = 32
REFERENCE = "reference loop (official)"
NONE_ROW = "none, 1 token/step"


@dataclass(frozen=True)
class Plan:
    """The rows of the three parts for one canvas size."""

    gen: int
    one_token_per_step: dict
    speed_rows: list  # part 1: (row, sampling parameters); None = the official loop
    accuracy_rows: list  # part 2
    batched: dict  # part 3: a fixed amount of work

    @classmethod
    def for_gen(cls, gen: int) -> Plan:
        one_token_per_step = dict(gen_length=gen, block_length=BLOCK, num_denoising_steps=gen)
        threshold = dict(gen_length=gen, block_length=BLOCK, confidence_threshold=0.9)
        return cls(
            gen=gen,
            one_token_per_step=one_token_per_step,
            # Early exit off except in the last row: every request computes its whole canvas.
            speed_rows=[
                (REFERENCE, None),
                (NONE_ROW, dict(one_token_per_step, early_exit=False)),
                ("prefix, 1 token/step", dict(one_token_per_step, kv_cache="prefix", early_exit=False)),
                ("dual, 1 token/step", dict(one_token_per_step, kv_cache="dual", early_exit=False)),
                ("none, τ 0.9", dict(threshold, early_exit=False)),
                ("dual, τ 0.9", dict(threshold, kv_cache="dual", early_exit=False)),
                ("dual, τ 0.9, early exit", dict(threshold, kv_cache="dual")),
            ],
            # Every cache mode with and without the threshold, early exit on.
            accuracy_rows=[
                (f"{mode}, {rule}", dict(base, kv_cache=mode))
                for rule, base in (("1 token/step", one_token_per_step), ("τ 0.9", threshold))
                for mode in ("none", "prefix", "dual")
            ],
            batched=dict(one_token_per_step, kv_cache="dual", early_exit=False),
        )


# Fast-dLLM's shape by default; `--gen-length` replaces it before anything runs. The embedded model was
# trained on canvases of at most 128 tokens: its accuracy means something up to there.
DEFAULT_GEN = 256
PLAN = Plan.for_gen(DEFAULT_GEN)


@dataclass
class SpeedRow:
    name: str
    seconds: float
    forward_seconds: float  # inside the model's forward: what the cache shrinks
    forwards_per_request: float
    canvas_tokens_per_s: float
    vs_none: float = 1.0
    vs_reference: float = 1.0
    forward_vs_none: float = 1.0  # the ceiling of vs_none: the same ratio counting model forwards only


class ForwardTimer:
    """Adds up the wall time spent inside the model's forward (hooks; on a CPU the host clock is the device's)."""

    def __init__(self, model):
        self.seconds = 0.0
        model.register_forward_pre_hook(self._start)
        model.register_forward_hook(self._end)

    def _start(self, module, args):
        self._started = time.perf_counter()

    def _end(self, module, args, output):
        self.seconds += time.perf_counter() - self._started


@dataclass
class AccuracyRow:
    name: str
    accuracy: float
    identical_to_none: float
    forwards_per_request: float
    canvas_tokens_per_s: float


def speed(engine: DiffusionEngine, examples) -> list[SpeedRow]:
    timer = ForwardTimer(engine.model)
    seconds = {name: 0.0 for name, _ in PLAN.speed_rows}
    forward_seconds = dict(seconds)
    forwards = {name: 0 for name, _ in PLAN.speed_rows}
    params = {name: SamplingParams(**kwargs) for name, kwargs in PLAN.speed_rows if kwargs is not None}
    for index, example in enumerate(examples):
        prompt = engine.tokenizer.encode_chat(example.messages)
        rotation = index % len(PLAN.speed_rows)
        outputs = {}
        for name, _ in PLAN.speed_rows[rotation:] + PLAN.speed_rows[:rotation]:
            forward_before = timer.seconds
            start = time.perf_counter()
            if name == REFERENCE:
                mask_id = engine.tokenizer.mask_id
                canvas, passes = reference_generate(
                    engine.model, prompt, gen_length=PLAN.gen, block_length=BLOCK, steps=PLAN.gen, mask_id=mask_id
                )
            else:
                result = engine.generate(prompt_token_ids=prompt, params=params[name])
                canvas, passes = result.canvas_ids, result.num_forward_passes
            seconds[name] += time.perf_counter() - start
            forward_seconds[name] += timer.seconds - forward_before
            forwards[name] += passes
            outputs[name] = canvas
        assert outputs[NONE_ROW] == outputs[REFERENCE], f"the engine differs from the reference loop on {example}"
    rows = []
    for name, _ in PLAN.speed_rows:
        rows.append(
            SpeedRow(
                name,
                seconds[name],
                forward_seconds[name],
                forwards[name] / len(examples),
                PLAN.gen * len(examples) / seconds[name],
                vs_none=seconds[NONE_ROW] / seconds[name],
                vs_reference=seconds[REFERENCE] / seconds[name],
                forward_vs_none=forward_seconds[NONE_ROW] / forward_seconds[name],
            )
        )
    return rows


def accuracy(engine: DiffusionEngine, examples) -> list[AccuracyRow]:
    texts: dict[str, list[str]] = {}
    rows = []
    for name, kwargs in PLAN.accuracy_rows:
        params = SamplingParams(**kwargs)
        start = time.perf_counter()
        results = [engine.generate(messages=e.messages, params=params) for e in examples]
        seconds = time.perf_counter() - start
        texts[name] = [r.text for r in results]
        baseline = texts[f"none, {name.split(', ', 1)[1]}"]
        rows.append(
            AccuracyRow(
                name,
                accuracy=sum(r.text.strip() == e.answer for r, e in zip(results, examples)) / len(examples),
                identical_to_none=sum(a == b for a, b in zip(texts[name], baseline)) / len(examples),
                forwards_per_request=sum(r.num_forward_passes for r in results) / len(examples),
                canvas_tokens_per_s=PLAN.gen * len(examples) / seconds,
            )
        )
    return rows


def cached_step_sweep(engine: DiffusionEngine, prompts: list[list[int]], rounds: int = 6) -> float:
    """The ceiling of batching cached steps: seconds of `len(prompts)` single dual-cached steps over the
    seconds of one step that shares them, alternated step by step inside the first block."""
    params = SamplingParams(**PLAN.batched)
    requests = [engine.new_request(prompt_token_ids=p, params=params) for p in prompts]
    for request in requests:
        engine.step([request])  # each block's first forward fills the cache; the next steps are cached
    alone = together = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for request in requests:
            engine.step([request])
        middle = time.perf_counter()
        engine.step(requests)
        alone += middle - start
        together += time.perf_counter() - middle
    return alone / together


async def batched_run(engine: DiffusionEngine, prompts: list[list[int]], concurrent: bool) -> float:
    return await timed_generations(engine, prompts, SamplingParams(**PLAN.batched), concurrent)


async def timed_generations(engine, prompts: list[list[int]], params: SamplingParams, concurrent: bool) -> float:
    """Seconds to generate every prompt, all submitted at once (sharing forwards) or one after another."""
    start = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(engine.agenerate(prompt_token_ids=p, params=params) for p in prompts))
    else:
        for p in prompts:
            await engine.agenerate(prompt_token_ids=p, params=params)
    return time.perf_counter() - start


def batching(engine: DiffusionEngine, examples, concurrency: int, rounds: int) -> dict:
    prompts = [engine.tokenizer.encode_chat(e.messages) for e in examples[:concurrency]]
    served = DiffusionEngine(
        engine.model, engine.tokenizer, engine.device, engine.model_name, SchedulerConfig(max_wait_ms=100)
    )
    ceiling = cached_step_sweep(engine, prompts)
    sequential = concurrent = 0.0
    for _ in range(rounds):
        sequential += asyncio.run(batched_run(served, prompts, concurrent=False))
        concurrent += asyncio.run(batched_run(served, prompts, concurrent=True))
    served.shutdown()
    speedup = sequential / concurrent
    return {"concurrency": concurrency, "speedup": speedup, "ceiling": ceiling, "share_of_ceiling": speedup / ceiling}


def print_speed(rows: list[SpeedRow], count: int) -> None:
    print(f"\n1. speed: gen {PLAN.gen}, block {BLOCK}, {count} prompts interleaved (batch 1)")
    print(f"| {'row':26} | forwards | canvas tok/s | × none | × none, model forwards only | × reference |")
    print(f"|{'-' * 28}|----------|--------------|--------|----------------------------|-------------|")
    for r in rows:
        print(
            f"| {r.name:26} | {r.forwards_per_request:8.1f} | {r.canvas_tokens_per_s:12.1f} | "
            f"{r.vs_none:5.2f}× | {r.forward_vs_none:25.2f}× | {r.vs_reference:10.2f}× |"
        )


def print_accuracy(rows: list[AccuracyRow], count: int) -> None:
    print(f"\n2. accuracy: {count} held-out prompts, gen {PLAN.gen}, block {BLOCK}, early exit on")
    print(f"| {'row':20} | accuracy | identical to none | forwards | canvas tok/s |")
    print(f"|{'-' * 22}|----------|-------------------|----------|--------------|")
    for r in rows:
        print(
            f"| {r.name:20} | {100 * r.accuracy:7.1f}% | {100 * r.identical_to_none:16.1f}% | "
            f"{r.forwards_per_request:8.1f} | {r.canvas_tokens_per_s:12.1f} |"
        )


def plot(rows: list[AccuracyRow], reference: SpeedRow, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    none = next(r for r in rows if r.name.startswith("none, 1"))
    points = [(REFERENCE, reference.canvas_tokens_per_s, none.accuracy, "s")]
    points += [(r.name, r.canvas_tokens_per_s, r.accuracy, "^" if "τ" in r.name else "o") for r in rows]
    for name, tokens_per_s, acc, marker in points:
        ax.scatter(tokens_per_s, 100 * acc, marker=marker, s=45)
        ax.annotate(name, (tokens_per_s, 100 * acc), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("canvas tokens/s, batch 1 (log scale)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_title(f"Embedded model, gen {PLAN.gen} block {BLOCK}: KV cache and threshold decoding")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    global PLAN
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: the embedded model)")
    ap.add_argument("--limit", type=int, default=400, help="held-out prompts for the accuracy part")
    ap.add_argument("--timing-prompts", type=int, default=24, help="prompts for the interleaved speed part")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the batching part")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the CPU service default is 1)")
    ap.add_argument("--gen-length", type=int, default=DEFAULT_GEN, help="canvas size of every part (blocks stay 32)")
    ap.add_argument("--plot", type=Path, default=None, help="write the accuracy-vs-speed plot here")
    ap.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    args = ap.parse_args()
    PLAN = Plan.for_gen(args.gen_length)

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu")
    examples = heldout_examples(max(args.limit, args.timing_prompts, args.concurrency))
    engine.generate(messages=examples[0].messages, params=SamplingParams(**PLAN.one_token_per_step))  # warm-up
    print(f"model {engine.model_name}, {torch.get_num_threads()} torch thread(s), CPU")

    speed_rows = speed(engine, examples[: args.timing_prompts])
    print_speed(speed_rows, args.timing_prompts)
    accuracy_rows = accuracy(engine, examples[: args.limit])
    print_accuracy(accuracy_rows, args.limit)
    batched = batching(engine, examples, args.concurrency, args.rounds)
    print(
        f"\n3. batching: {batched['concurrency']} concurrent dual-cached requests (1 token/step) vs one after "
        f"another: {batched['speedup']:.2f}× faster; ceiling from the step sweep {batched['ceiling']:.2f}× "
        f"→ {100 * batched['share_of_ceiling']:.0f}% of it"
    )
    if args.plot:
        plot(accuracy_rows, speed_rows[0], args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        report = {
            "speed": [asdict(r) for r in speed_rows],
            "accuracy": [asdict(r) for r in accuracy_rows],
            "batching": batched,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
