"""A lone sync request: `generate()` through the scheduler thread vs stepping the model on the caller's thread.

    python benchmarks/sync_path.py [--rounds 20] [--model DIR] [--device cpu|cuda] [--threads 1]

`generate()` submits to the engine's scheduler thread (one execution model for the sync and async APIs).
The baseline is the loop the sync API used to run on the calling thread: `new_request`, then `step` until
finished. Both run in this process, interleaved request by request (alternating which goes first), so
machine noise hits both alike; outputs are checked to be identical. Prints the median latency of each and
the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from engine import DiffusionEngine, SamplingParams  # noqa: E402

PROMPTS = ["What is 3 plus 4?", "Spell cat.", "Count from 3 to 6.", "Which is larger, 4 or 7?"]


def caller_thread_generate(engine: DiffusionEngine, messages: list[dict], params: SamplingParams):
    request = engine.new_request(messages=messages, params=params)
    while not request.finished:
        (event,) = engine.step([request])
        if isinstance(event, Exception):
            raise event
    return request.result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: the embedded model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the service's default is 1)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--gen-length", type=int, default=32)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device=args.device)
    params = SamplingParams(gen_length=args.gen_length, num_denoising_steps=args.gen_length)
    paths = {
        "caller thread": lambda m: caller_thread_generate(engine, m, params),
        "scheduler thread": lambda m: engine.generate(messages=m, params=params),
    }
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(args.rounds + 1):  # round 0 warms both paths up
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            order = list(paths) if round_ % 2 else list(paths)[::-1]
            results = {}
            for name in order:
                started = time.perf_counter()
                results[name] = paths[name](messages)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                if round_:
                    seconds[name].append(time.perf_counter() - started)
            assert results["caller thread"] == results["scheduler thread"], prompt
    engine.shutdown()

    base = statistics.median(seconds["caller thread"])
    print(
        f"model {engine.model_name} on {args.device}, gen {args.gen_length} = steps, {len(PROMPTS)} prompts "
        f"x {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:>17}: median {median * 1000:8.2f} ms per request   ratio {median / base:.3f}")


if __name__ == "__main__":
    main()
