"""Step-level batching: throughput and latency of N concurrent requests vs the same N one after another.

For each concurrency N, the same N requests (temperature 0, so both runs produce identical text) are run
- sequentially: awaited one at a time through the async API (the scheduler steps a batch of one), and
- concurrently: all submitted at once, sharing forwards on the scheduler thread.
Throughput is canvas tokens per second of wall time: each request asks for `gen_length` tokens, and every
one of them is decided when it finishes (with early exit, the positions after the end of the answer are
decided by the EOS/EOT before them). The returned content is usually shorter; since both modes produce the
same text, its rate has the same ratio and is printed below the table. Latency is per request, from
submission to its result. Rounds alternate the two modes so background load hits both
alike, and the table reports the median over rounds.

Usage:
  python benchmarks/batching.py                                   # embedded model, 1 2 4 8 16
  python benchmarks/batching.py --model tests/fixtures/llada-tiny  # development, before it is trained
  python benchmarks/batching.py --use-local-leap                   # LocalLeap × batching
  python benchmarks/batching.py --forward-sweep                    # the model forward alone per batch size
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
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make `engine` and `scripts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import DiffusionEngine, SamplingParams, SchedulerConfig

# Used when the training corpus module is unavailable: prompts in the style of its held-out split.
FALLBACK_PROMPTS = [
    "What is 7 plus 5?", "Spell the word cherry.", "Which number is bigger: 3 or 8?", "Count up from 2 to 6.",
    "What is the next number after 11?", "Name the capital of Japan.", 'Please repeat "green river".',
    "Subtract 4 from 9.", "How do you spell tiger?", "Which is smaller, 6 or 1?", "Tell me the color of grass.",
    'Say "moon cake".', "What is the number just before 15?", "List the numbers from 4 to 8.",
    "What is 8 - 3?", "How many legs has a spider?",
]  # fmt: skip


def load_prompts(count: int) -> tuple[list[list[dict]], str]:
    """Held-out prompts of the embedded model's corpus (never trained on), families interleaved."""
    try:
        from scripts.tiny_chat_corpus import heldout_examples

        return [e.messages for e in heldout_examples(count)], "held-out split of scripts/tiny_chat_corpus.py"
    except Exception:  # noqa: BLE001 - the corpus module is optional here
        prompts = (FALLBACK_PROMPTS * (count // len(FALLBACK_PROMPTS) + 1))[:count]
        return [[{"role": "user", "content": p}] for p in prompts], "built-in held-out-style prompts"


@dataclass
class Run:
    wall_s: float
    latencies_s: list[float]
    content_tokens: int
    canvas_tokens: int
    forwards: int

    @property
    def throughput(self) -> float:
        return self.canvas_tokens / self.wall_s


async def timed(engine: DiffusionEngine, messages: list[dict], params: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    result = await engine.agenerate(messages=messages, params=params)
    return time.perf_counter() - start, result.completion_tokens


async def run_requests(engine, requests, params, concurrent: bool) -> Run:
    """All `requests` at once (they share forwards) or one after another (each steps alone)."""
    forwards_before = engine.stats.snapshot()["dllm_forward_passes_total"]
    start = time.perf_counter()
    if concurrent:
        outcomes = await asyncio.gather(*(timed(engine, messages, params) for messages in requests))
    else:
        outcomes = [await timed(engine, messages, params) for messages in requests]
    wall = time.perf_counter() - start
    forwards = engine.stats.snapshot()["dllm_forward_passes_total"] - forwards_before
    latencies, content = [o[0] for o in outcomes], sum(o[1] for o in outcomes)
    return Run(wall, latencies, content, len(requests) * params.gen_length, forwards)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.throughput)[len(runs) // 2]


async def benchmark(engine, prompts, params, concurrencies, rounds) -> list[dict]:
    # Warm-up: the first forwards of a process (allocator, kernels) are several times slower.
    await run_requests(engine, prompts[: max(concurrencies)], params, concurrent=True)
    await run_requests(engine, prompts[:2], params, concurrent=False)
    rows = []
    for n in concurrencies:
        requests = prompts[:n]
        sequential, concurrent = [], []
        for _ in range(rounds):
            sequential.append(await run_requests(engine, requests, params, concurrent=False))
            concurrent.append(await run_requests(engine, requests, params, concurrent=True))
        seq, con = median_run(sequential), median_run(concurrent)
        single_latency = statistics.median(lat for run in sequential for lat in run.latencies_s)
        rows.append(
            {
                "n": n,
                "seq_tps": seq.throughput,
                "con_tps": con.throughput,
                "speedup": con.throughput / seq.throughput,
                "single_p50": single_latency,
                "p50": percentile(con.latencies_s, 0.5),
                "p95": percentile(con.latencies_s, 0.95),
                "latency_ratio": percentile(con.latencies_s, 0.5) / single_latency,
                # Request-steps per forward: every sequential forward serves exactly one request-step.
                "mean_batch": seq.forwards / con.forwards,
                "content_tps": con.content_tokens / con.wall_s,
                "seq_content_tps": seq.content_tokens / seq.wall_s,
            }
        )
        print(format_row(rows[-1]), flush=True)
    print()
    print(
        "content tokens/s (the returned text, before EOS/EOT), sequential → batched: "
        + ", ".join(f"{r['n']}: {r['seq_content_tps']:.0f} → {r['content_tps']:.0f}" for r in rows)
    )
    return rows


@torch.inference_mode()
def forward_sweep(engine, batches: list[int], canvas: int = 48, candidates: int = 32) -> None:
    """The model forward alone vs batch size: the bound any batching gain on this machine is under."""
    from engine.model import LogitIndex

    times = {}
    for batch in batches:
        ids = torch.randint(0, engine.model.config.vocab_size, (batch, canvas))
        index = LogitIndex(torch.arange(canvas - candidates, canvas).repeat(batch, 1))
        for _ in range(20):
            engine.model(ids, None, logit_index=index)
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(50):
                engine.model(ids, None, logit_index=index)
            samples.append((time.perf_counter() - start) / 50)
        times[batch] = statistics.median(samples)
    print(f"forward only (canvas {canvas}, {candidates} candidates per row, median of 5 × 50):")
    print("| batch | " + " | ".join(str(b) for b in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    print("| forward (ms) | " + " | ".join(f"{times[b] * 1e3:.2f}" for b in batches) + " |")
    rates = [f"{b * times[batches[0]] / (batches[0] * times[b]):.2f}×" for b in batches]
    print(f"| request-steps per ms vs batch {batches[0]} | " + " | ".join(rates) + " |")


HEADER = (
    "| concurrent | sequential tok/s | batched tok/s | speedup | single p50 (ms) | batched p50 (ms) "
    "| batched p95 (ms) | p50 / single | mean batch |"
)
RULE = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def format_row(row: dict) -> str:
    ms = {key: row[key] * 1e3 for key in ("single_p50", "p50", "p95")}
    return (
        f"| {row['n']} | {row['seq_tps']:.0f} | {row['con_tps']:.0f} | {row['speedup']:.2f}× "
        f"| {ms['single_p50']:.1f} | {ms['p50']:.1f} | {ms['p95']:.1f} | {row['latency_ratio']:.2f} "
        f"| {row['mean_batch']:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=32, help="num_denoising_steps")
    parser.add_argument("--block-length", type=int, default=None)
    parser.add_argument("--use-local-leap", action="store_true")
    parser.add_argument("--max-batch-size", type=int, default=None, help="default: the largest --concurrency")
    parser.add_argument("--max-wait-ms", type=float, default=0.0, help="SchedulerConfig.max_wait_ms (default 0)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode and concurrency (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON (for the plots)")
    parser.add_argument("--forward-sweep", action="store_true", help="only time the model forward per batch size")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    config = SchedulerConfig(
        max_batch_size=args.max_batch_size or max(args.concurrency), max_waiting=256, max_wait_ms=args.max_wait_ms
    )
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu", scheduler_config=config)
    params = SamplingParams(
        gen_length=args.gen_length,
        block_length=args.block_length,
        num_denoising_steps=args.steps,
        use_local_leap=args.use_local_leap,
    )
    if args.forward_sweep:
        forward_sweep(engine, args.concurrency)
        return
    prompts, source = load_prompts(max(args.concurrency))
    print(
        f"model {engine.model_name} ({engine.model.num_parameters() / 1e6:.2f}M params), "
        f"gen_length {params.gen_length}, block_length {params.block_length}, steps {params.num_denoising_steps}, "
        f"LocalLeap {'on' if params.use_local_leap else 'off'}, temperature 0, max_batch_size {config.max_batch_size}, "
        f"max_wait_ms {config.max_wait_ms:g}"
    )
    print(
        f"prompts: {source}; machine: {platform.machine()} {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads; rounds {args.rounds}"
    )
    print(HEADER)
    print(RULE)
    try:
        rows = asyncio.run(benchmark(engine, prompts, params, args.concurrency, args.rounds))
        if args.json:
            args.json.write_text(json.dumps({"use_local_leap": params.use_local_leap, "rows": rows}, indent=1))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
