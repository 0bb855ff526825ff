"""What one training step of the embedded model's recipe costs, eager against compiled (issue 28).

The recipe's budget is minutes, so a faster step is more training. This times `scripts/train_tiny_model.py`'s
own step (`train_step`: its loss, backward, clipping and optimiser step; its Batcher, model and optimiser)
on the same pre-drawn batches, in one process, after timing the draw of those batches:

  eager                    the model's forward and backward as PyTorch runs them, foreach AdamW
  compiled, foreach AdamW  `compiled_for_training` (inductor, one dynamic graph per mask case)
  compiled, fused AdamW    the same with the optimiser's fused kernels (`optimizer`)
  ..., whole grid          the same with the last block's MLP over its whole [B, M] grid of masked positions,
                           fillers included, and these dropped after the LM head: the trainer before 6 December
  ..., pads skipped        the fused one with the per-token work on the real positions only (`train_step`'s
                           `skip_pads`, the model's `RealTokens`): the trainer's default
  compiled, fused, bf16    the same forward under bfloat16 autocast (products in bfloat16, weights and optimiser
                           in float32): what a CPU with AMX might gain (on this one it lost:
                           docs/embedded-model-runs.md)

Each variant trains its own copy of the same initial weights; the first `--warm` steps (the compile) are
timed apart from the `--steps` after them. Rounds alternate the variants, so a noisy machine slows them alike;
the ratio is of medians. The losses of each against eager's after the same batches are printed too: compiling
and fusing change the order of floating-point sums, not the maths (bfloat16 changes the rounding).

Usage: python benchmarks/train_step.py [--steps 40] [--warm 10] [--rounds 2] [--batch 32] [--no-bfloat16]

`--no-bfloat16` leaves the bfloat16 variant out: on this CPU it takes most of the run (about 0.5 steps/s, and
its compile alone about 100 s).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the trainer sets it

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import LLaDAConfig  # noqa: E402
from engine.model import LLaDAModelLM, LogitIndex  # noqa: E402
from engine.tokenizer import ChatTokenizer  # noqa: E402
from scripts import train_tiny_model as trainer  # noqa: E402

MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-llada-chat"


def in_bfloat16(forward):
    """`forward` under bfloat16 autocast (the loss, the backward's master weights and the optimiser stay float32)."""

    def autocast_forward(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    return autocast_forward


def whole_grid(forward):
    """`forward` computing the last block over the whole grid of its logit index, the fillers' logits dropped
    after the LM head: the model's forward before it dropped them ahead of the MLP."""

    def grid_forward(input_ids, attention_mask, logit_index, real_tokens=None):
        logits = forward(
            input_ids, attention_mask, logit_index=LogitIndex(logit_index.columns), real_tokens=real_tokens
        )
        return logits if logit_index.real is None else logits[logit_index.real]

    return grid_forward


def trainers_batcher(batch: int) -> tuple[LLaDAConfig, trainer.Batcher]:
    """The shipped model's config and the trainer's batch draw (seed 0), in a process set up as the trainer sets
    its own (2 threads, denormals flushed), with torch's seed 0 for the initial weights."""
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    config = LLaDAConfig.from_file(MODEL_DIR / "config.json")
    return config, trainer.Batcher(ChatTokenizer.from_pretrained(MODEL_DIR, config), random.Random(0), 0, batch)


def train(forward, model, batches, fused: bool, skip_pads: bool) -> tuple[list[float], float]:
    """The trainer's step on each of `batches`, with its optimiser; the losses and the seconds it took."""
    opt = trainer.optimizer(model, fused=fused)
    start = time.perf_counter()
    losses = [trainer.train_step(forward, model, opt, batch, skip_pads) for batch in batches]
    return losses, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant and round")
    ap.add_argument("--warm", type=int, default=10, help="steps before timing (the compile happens here)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=trainer.BATCH)
    ap.add_argument("--no-bfloat16", action="store_true", help="leave the bfloat16 variant out (the slowest here)")
    args = ap.parse_args()
    config, batcher = trainers_batcher(args.batch)
    started = time.perf_counter()
    batches = [batcher.draw() for _ in range(args.warm + args.steps)]
    print(f"drawing a batch: {(time.perf_counter() - started) / len(batches) * 1e3:.1f} ms", flush=True)
    initial = LLaDAModelLM(config)
    trainer.init_weights(initial)

    # name: (the forward, a fused optimiser, pads skipped)
    variants = {
        "eager": (lambda m: m, False, False),
        "compiled, foreach AdamW": (trainer.compiled_for_training, False, False),
        "compiled, fused AdamW": (trainer.compiled_for_training, True, False),
        "compiled, fused, bf16": (lambda m: in_bfloat16(trainer.compiled_for_training(m)), True, False),
        "compiled, fused, whole grid (the trainer before)": (
            lambda m: whole_grid(trainer.compiled_for_training(m)),
            True,
            False,
        ),
        "compiled, fused, pads skipped (the trainer's)": (trainer.compiled_for_training, True, True),
    }
    if args.no_bfloat16:
        del variants["compiled, fused, bf16"]
    models, forwards, times = {}, {}, {name: [] for name in variants}
    first_losses = {}
    for name, (wrap, fused, skip_pads) in variants.items():  # warm-up round: the compile, and the losses below
        models[name] = copy.deepcopy(initial).train()
        forwards[name] = wrap(models[name])
        losses, seconds = train(forwards[name], models[name], batches[: args.warm], fused, skip_pads)
        first_losses[name] = losses
        print(f"{name:48s} warm-up {args.warm} steps: {seconds:6.1f} s", flush=True)
    for _ in range(args.rounds):
        for name, (_, fused, skip_pads) in variants.items():
            _, seconds = train(forwards[name], models[name], batches[args.warm :], fused, skip_pads)
            times[name].append(args.steps / seconds)
    print(f"\nbatch {args.batch}, {args.steps} steps x {args.rounds} rounds, 2 threads (median steps/s):")
    eager = statistics.median(times["eager"])
    before = statistics.median(times["compiled, fused, whole grid (the trainer before)"])
    for name in variants:
        rate = statistics.median(times[name])
        rounds = ", ".join(f"{r:.2f}" for r in times[name])
        print(
            f"  {name:48s} {rate:5.2f} steps/s   {rate / eager:4.2f}x eager   {rate / before:4.2f}x the trainer before"
            f"   rounds: {rounds}"
        )
    for name in list(variants)[1:]:
        diff = max(abs(a - b) for a, b in zip(first_losses["eager"], first_losses[name]))
        print(f"largest loss difference over the first {args.warm} steps, eager vs {name}: {diff:.2e}")


if __name__ == "__main__":
    main()
