"""Exact-match evaluation of a chat model on the held-out split of the synthetic corpus.

Runs every held-out prompt through the engine's offline API (`DiffusionEngine.new_request` + `step`, i.e.
what `generate` does, with several requests sharing each forward pass; rows of a batch compute what they
would alone) and prints exact-match accuracy per family and overall, mean forward passes, tokens/s and
the share of answers that ended with end-of-turn/EOS (finish_reason "stop").

Usage: python scripts/eval_tiny_model.py [--model DIR] [--gen-length 32 --block-length 32 --steps 32
       --temperature 0 --use-local-leap] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

# Spinning OpenMP threads slow everything down 10x when the two cores are shared (see train_tiny_model.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `scripts` and `engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from scripts.tiny_chat_corpus import FAMILIES, heldout_examples  # noqa: E402


def run(engine: DiffusionEngine, examples, params: SamplingParams, batch: int):
    results = []
    for i in range(0, len(examples), batch):
        requests = [engine.new_request(messages=e.messages, params=params) for e in examples[i : i + batch]]
        done: dict[int, object] = {}
        while len(done) < len(requests):
            live = [(j, r) for j, r in enumerate(requests) if j not in done]
            for (j, _), event in zip(live, engine.step([r for _, r in live])):
                if isinstance(event, Exception):
                    raise event
                if event.finished:
                    done[j] = event.result
        results += [done[j] for j in range(len(requests))]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: the embedded model)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (used when temperature > 0)")
    ap.add_argument("--use-local-leap", action="store_true")
    ap.add_argument("--limit", type=int, default=400, help="number of held-out prompts")
    ap.add_argument("--batch", type=int, default=32, help="requests per forward pass (1 = plain generate)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu")
    params = SamplingParams(
        gen_length=args.gen_length,
        block_length=args.block_length,
        num_denoising_steps=args.steps,
        temperature=args.temperature,
        seed=args.seed,
        use_local_leap=args.use_local_leap,
    )
    examples = heldout_examples(args.limit)
    start = time.perf_counter()
    results = run(engine, examples, params, args.batch)
    seconds = time.perf_counter() - start

    hits: dict[str, list[bool]] = defaultdict(list)
    for e, r in zip(examples, results):
        hits[e.family].append(r.text.strip() == e.answer)
    leap = "on" if params.use_local_leap else "off"
    print(
        f"model {engine.model_name}: gen {params.gen_length}, block {params.block_length}, "
        f"{params.num_denoising_steps} steps, T={params.temperature}, LocalLeap {leap}"
    )
    print(f"{'family':12s} {'n':>4s} {'exact':>7s}")
    for family in FAMILIES:
        if hits[family]:
            print(f"{family:12s} {len(hits[family]):4d} {sum(hits[family]) / len(hits[family]):7.1%}")
    total = [h for v in hits.values() for h in v]
    tokens = sum(r.completion_tokens for r in results)
    print(f"{'overall':12s} {len(total):4d} {sum(total) / len(total):7.1%}")
    print(f"mean forward passes {sum(r.num_forward_passes for r in results) / len(results):.1f}")
    print(f"finish_reason stop  {sum(r.finish_reason == 'stop' for r in results) / len(results):.1%}")
    print(f"tokens/s            {tokens / seconds:.1f}  ({tokens} tokens, {seconds:.1f} s, batch {args.batch})")


if __name__ == "__main__":
    main()
