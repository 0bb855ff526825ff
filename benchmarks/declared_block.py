"""The embedded model's declared block length against blocks of 32, on the request a client sends by default.

A LLaDA checkpoint may declare the block length of a request that sets none (generation_config.json
`block_length`). This compares what the embedded model declares with blocks of 32 (what it declared before,
as LLaDA's chat example decodes), at gen 128 (no `max_tokens`) and gen 32 (`max_tokens` 32), one request at a
time as a lone client sends them, the two settings interleaved prompt by prompt so that background load hits
both alike. Per row: exact-match accuracy on held-out prompts (tasks and what the model cannot do), mean
forward passes and milliseconds per request, and the ratios to blocks of 32 (speed-up: blocks of 32's time
over this row's).

Usage: python benchmarks/declared_block.py [--limit 60] [--model DIR] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from scripts.tiny_chat_corpus import heldout_examples  # noqa: E402

BASELINE_BLOCK = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=60, help="held-out prompts per kind (tasks, out of range)")
    ap.add_argument("--model", default=None, help="model directory (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    engine = DiffusionEngine.from_pretrained(args.model, device="cpu")
    declared = engine.sampler_defaults.block_length
    examples = heldout_examples(args.limit, phrasing="heldout") + heldout_examples(
        args.limit, families=("out_of_range",)
    )
    print(f"model {engine.model_name}: declares blocks of {declared}; {len(examples)} held-out prompts, batch 1")
    print(f"{'canvas':>6} {'block':>5} {'right':>7} {'passes':>7} {'ms':>7} {'speed-up':>8} {'passes ratio':>12}")
    for gen in (128, 32):
        blocks = {block: {"right": 0, "passes": 0, "seconds": 0.0} for block in (BASELINE_BLOCK, declared)}
        for e in examples:
            for block, totals in blocks.items():
                params = SamplingParams(gen_length=gen, block_length=block, temperature=0.0)
                start = time.perf_counter()
                result = engine.generate(messages=e.messages, params=params)
                totals["seconds"] += time.perf_counter() - start
                totals["right"] += e.is_right(result.text)
                totals["passes"] += result.num_forward_passes
        base = blocks[BASELINE_BLOCK]
        for block, totals in blocks.items():
            n = len(examples)
            print(
                f"{gen:>6} {block:>5} {totals['right'] / n:>7.1%} {totals['passes'] / n:>7.1f}"
                f" {1000 * totals['seconds'] / n:>7.1f} {base['seconds'] / totals['seconds']:>7.2f}x"
                f" {totals['passes'] / base['passes']:>12.2f}"
            )
    engine.shutdown()


if __name__ == "__main__":
    main()
