"""What a wider embedded model would cost per training step, against the shipped width (issue 28).

A stage-1 draw of the embedded model's recipe ends anywhere between 89% and 97.5% of its held-out phrasings
(docs/embedded-model-runs.md), and more steps do not fit the 30-minute budget. A wider model may learn the
families with more margin in the same steps; on two cores small products are overhead-bound, so its step may
cost less than its arithmetic. This times the trainer's own step (`train_step`, compiled forward, fused AdamW,
pads skipped) on the same pre-drawn batches for d_model 128 (the shipped width) and wider ones, MLP 3 x d_model
and 4 heads as shipped, in alternating rounds, and prints the ratio of medians to the shipped width's.

Usage: python benchmarks/train_width.py [--widths 128 192 256] [--steps 40] [--warm 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# benchmarks.train_step sets OMP_WAIT_POLICY as the trainer does, before torch starts
from benchmarks.train_step import train, trainers_batcher  # noqa: E402
from engine.model import LLaDAModelLM  # noqa: E402
from scripts import train_tiny_model as trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--widths", type=int, nargs="+", default=[128, 192, 256], help="d_model values; the first is the baseline"
    )
    ap.add_argument("--steps", type=int, default=40, help="timed steps per width and round")
    ap.add_argument("--warm", type=int, default=10, help="steps before timing (the compile happens here)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shipped, batcher = trainers_batcher(trainer.BATCH)
    batches = [batcher.draw() for _ in range(args.warm + args.steps)]

    models, forwards, times = {}, {}, {width: [] for width in args.widths}
    for width in args.widths:  # warm-up round: the compile
        config = dataclasses.replace(shipped, d_model=width, mlp_hidden_size=3 * width)
        models[width] = LLaDAModelLM(config).train()
        trainer.init_weights(models[width])
        forwards[width] = trainer.compiled_for_training(models[width])
        _, seconds = train(forwards[width], models[width], batches[: args.warm], True, True)
        print(f"d_model {width}: {models[width].num_parameters():,} parameters, warm-up {seconds:.1f} s", flush=True)
    for _ in range(args.rounds):
        for width in args.widths:
            _, seconds = train(forwards[width], models[width], batches[args.warm :], True, True)
            times[width].append(args.steps / seconds)

    print(f"\nbatch {trainer.BATCH}, {args.steps} steps x {args.rounds} rounds, 2 threads (median steps/s):")
    baseline = statistics.median(times[args.widths[0]])
    for width in args.widths:
        rate = statistics.median(times[width])
        rounds = ", ".join(f"{r:.2f}" for r in times[width])
        print(f"  d_model {width:4d}  {rate:5.2f} steps/s   {rate / baseline:4.2f}x the first width   rounds: {rounds}")


if __name__ == "__main__":
    main()
