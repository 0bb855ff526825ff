"""Fast-dLLM's KV cache on the Dream family: dual (and prefix) against no cache, in one run, on dream-tiny.

At gen 256 (or --gen-length) with blocks of 32 (Fast-dLLM's Dream setting), batch 1, on the dream-tiny fixture
checkpoint (tests/fixtures/dream-tiny: 2 layers, hidden 64, random weights) and the chat prompts of its
reference. Rows: kv_cache none / prefix / dual with the family's default schedule at one step per token, and
threshold decoding (τ 0.9, top-1 probability) without and with the dual cache. Early exit is off, so every request
computes its whole canvas: the work per row is fixed.

The rows are timed interleaved, prompt by prompt (each prompt runs every row in turn, the order rotated), so that
background load hits all rows alike. Printed per row: forwards per request, canvas tokens per second, the ratio
of its time to the uncached row of the same rule (× none), the same ratio counting only the time inside model
forwards (the ceiling of the cache's speedup: the rest of a step is the same in every mode), and the share of
canvas tokens identical to the uncached row (the cache is an approximation; on random weights this says nothing
about quality, only that the outputs differ where Fast-dLLM's would).

Usage: python benchmarks/dream_kv_cache.py [--gen-length 256] [--prompts 8] [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.kv_cache import ForwardTimer  # noqa: E402
from engine import DiffusionEngine, SamplingParams  # noqa: E402
from tests.fixture_paths import DREAM_FIXTURE_DIR, dream_reference  # noqa: E402

BLOCK = 32


def rows_for(gen: int) -> list[tuple[str, str, dict]]:
    """(row, the uncached row it is compared with, sampling parameters)."""
    quota = dict(gen_length=gen, block_length=BLOCK, num_denoising_steps=gen, early_exit=False)
    threshold = dict(gen_length=gen, block_length=BLOCK, confidence_threshold=0.9, confidence_metric="top1_prob",
                     early_exit=False)  # fmt: skip
    return [
        ("none, 1 token/step", "none, 1 token/step", quota),
        ("prefix, 1 token/step", "none, 1 token/step", dict(quota, kv_cache="prefix")),
        ("dual, 1 token/step", "none, 1 token/step", dict(quota, kv_cache="dual")),
        ("none, τ 0.9", "none, τ 0.9", threshold),
        ("dual, τ 0.9", "none, τ 0.9", dict(threshold, kv_cache="dual")),
    ]


@dataclass
class Row:
    name: str
    baseline: str
    seconds: float = 0.0
    forward_seconds: float = 0.0
    forwards: int = 0
    identical_tokens: int = 0
    canvas_tokens: int = 0
    vs_none: float = 1.0
    forward_vs_none: float = 1.0

    def per_request(self, count: int) -> float:
        return self.forwards / count


def run(engine: DiffusionEngine, prompts: list[list[int]], gen: int) -> list[Row]:
    plan = rows_for(gen)
    params = {name: SamplingParams(**kwargs) for name, _, kwargs in plan}
    rows = {name: Row(name, baseline) for name, baseline, _ in plan}
    timer = ForwardTimer(engine.model)
    for index, prompt in enumerate(prompts):
        rotation = index % len(plan)
        canvases = {}
        for name, _, _ in plan[rotation:] + plan[:rotation]:
            row, forward_before = rows[name], timer.seconds
            start = time.perf_counter()
            result = engine.generate(prompt_token_ids=prompt, params=params[name])
            row.seconds += time.perf_counter() - start
            row.forward_seconds += timer.seconds - forward_before
            row.forwards += result.num_forward_passes
            canvases[name] = result.canvas_ids
        for row in rows.values():
            baseline = canvases[row.baseline]
            row.identical_tokens += sum(a == b for a, b in zip(canvases[row.name], baseline))
            row.canvas_tokens += len(baseline)
    for row in rows.values():
        baseline = rows[row.baseline]
        row.vs_none = baseline.seconds / row.seconds
        row.forward_vs_none = baseline.forward_seconds / row.forward_seconds
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=8, help="chat prompts of the dream-tiny reference")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(DREAM_FIXTURE_DIR, device="cpu")
    try:
        chat = [p["prompt_ids"] for p in dream_reference()["prompts"]]
        prompts = [chat[i % len(chat)] for i in range(args.prompts)]
        warm_up = SamplingParams(**rows_for(args.gen_length)[2][2])  # the dual row, untimed
        engine.generate(prompt_token_ids=prompts[0], params=warm_up)
        rows = run(engine, prompts, args.gen_length)
    finally:
        engine.shutdown()

    count = len(prompts)
    print(f"Dream KV cache: dream-tiny, gen {args.gen_length}, block {BLOCK}, {count} prompts interleaved, batch 1, "
          f"{args.threads} thread(s); {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"| {'row':21} | forwards | canvas tok/s | × none | × none, model forwards only | tokens = none |")
    print(f"|{'-' * 23}|----------|--------------|--------|----------------------------|---------------|")
    for r in rows:
        tokens_per_s = r.canvas_tokens / r.seconds
        print(
            f"| {r.name:21} | {r.per_request(count):8.1f} | {tokens_per_s:12.1f} | {r.vs_none:5.2f}× | "
            f"{r.forward_vs_none:25.2f}× | {100 * r.identical_tokens / r.canvas_tokens:12.1f}% |"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
