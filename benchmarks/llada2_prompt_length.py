"""Per-forward cost of LLaDA2's exact block cache against the prompt's length, at the same canvas.

A block-diffusion step computes only the current block against the cached keys and values of the prompt and
the finished blocks (engine/block_step.py), so a step's cost should barely depend on the prompt. This runs
the same requests (gen 32, blocks of 32, LLaDA2.0 at one token per forward, so every forward is a full step)
with a 32-token and a 480-token prompt on the tiny fixture model, times every forward after the first (the
first computes the prompt once), and prints the medians and their ratio. For contrast it also times what the
official loop does at each step: a forward over the whole prefix [0, block end) without a cache.

Usage: python benchmarks/llada2_prompt_length.py [--requests 6] [--device cpu] [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from engine.llada2 import block_causal_mask  # noqa: E402
from engine.loading import load_model  # noqa: E402
from tests.fixture_paths import LLADA2_FIXTURE_DIR  # noqa: E402
from tests.llada2_engine import TokenIdText  # noqa: E402

PROMPT_LENGTHS = (32, 480)
GEN, BLOCK = 32, 32


def prompt_of(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 500, (length,), generator=generator).tolist()  # below the special ids 508..511


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cached_step_times(engine: DiffusionEngine, prompt: list[int]) -> tuple[float, list[float]]:
    """(the first forward's seconds, every later forward's) for one request stepped alone."""
    params = SamplingParams(gen_length=GEN, block_length=BLOCK, num_denoising_steps=GEN, early_exit=False)
    request = engine.new_request(prompt_token_ids=prompt, params=params)
    times = []
    while not request.finished:
        sync(engine.device)
        started = time.perf_counter()
        (event,) = engine.step([request])
        sync(engine.device)
        times.append(time.perf_counter() - started)
        if isinstance(event, Exception):
            raise event
    return times[0], times[1:]


@torch.inference_mode()
def uncached_forward_time(model, prompt: list[int], device: torch.device, repeats: int) -> float:
    """Median seconds of one official-style step: the whole prefix up to the answer's first block end."""
    end = -(-(len(prompt) + 1) // BLOCK) * BLOCK
    ids = torch.tensor([prompt + [TokenIdText.mask_id] * (end - len(prompt))], device=device)
    mask = block_causal_mask(end, BLOCK, device)[None, None]
    times = []
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        model(ids, attention_mask=mask)
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6, help="requests per prompt length (interleaved)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: least noise on a shared CPU)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = load_model(LLADA2_FIXTURE_DIR, device, torch.float32)
    engine = DiffusionEngine(model, TokenIdText(), device, "llada2-tiny")
    cached_to_prompt_length(engine, PROMPT_LENGTHS[0])  # warm-up
    steps: dict[int, list[float]] = {n: [] for n in PROMPT_LENGTHS}
    firsts: dict[int, list[float]] = {n: [] for n in PROMPT_LENGTHS}
    for i in range(args.requests):
        for length in PROMPT_LENGTHS if i % 2 == 0 else reversed(PROMPT_LENGTHS):  # alternate the order
            first, later = cached_step_times(engine, prompt_of(length, seed=i))
            firsts[length].append(first)
            steps[length].extend(later)
    uncached = {n: uncached_forward_time(model, prompt_of(n, 0), device, 5 * args.requests) for n in PROMPT_LENGTHS}

    report = {}
    print(f"LLaDA2 tiny fixture, {device}, gen {GEN}, block {BLOCK}, one token per forward")
    # The fastest step is printed beside the median: on a shared CPU it is the least disturbed by other load.
    print(f"{'prompt':>7} {'cached step: median':>20} {'fastest':>10} {'first forward':>14} {'uncached step':>14}")
    for n in PROMPT_LENGTHS:
        step, fastest, first = statistics.median(steps[n]), min(steps[n]), statistics.median(firsts[n])
        report[n] = {
            "cached_step_ms": step * 1e3,
            "fastest_cached_step_ms": fastest * 1e3,
            "first_forward_ms": first * 1e3,
            "uncached_step_ms": uncached[n] * 1e3,
        }
        print(
            f"{n:>7} {step * 1e3:>17.3f} ms {fastest * 1e3:>7.3f} ms {first * 1e3:>11.3f} ms "
            f"{uncached[n] * 1e3:>11.3f} ms"
        )
    short, long = PROMPT_LENGTHS
    keys = ("cached_step_ms", "fastest_cached_step_ms", "uncached_step_ms")
    ratios = {key: report[long][key] / report[short][key] for key in keys}
    print(
        f"step cost ratio, prompt {long} / {short}: cached {ratios['cached_step_ms']:.2f} (median), "
        f"{ratios['fastest_cached_step_ms']:.2f} (fastest); uncached {ratios['uncached_step_ms']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({"steps": report, "ratios": ratios}, indent=2))


def cached_to_prompt_length(engine: DiffusionEngine, length: int) -> None:
    cached_step_times(engine, prompt_of(length, seed=12345))


if __name__ == "__main__":
    main()
