"""The compiled static-shape forward (engine/compiled.py) against eager, on the embedded model, in one run.

Two engines on the same weights, one eager and one compiled, warmed up with the same plan (batch 1 and 8,
kv_cache none, prefix and dual, the shapes of these prompts). Then, for each row (none / prefix / dual at one token
per forward, and threshold decoding τ 0.9 without and with the dual cache) at batch 1 and at batch 8
(8 requests stepped together, as the scheduler does), both engines generate the same prompts, alternating
which goes first; one untimed pass of each row comes first (the first request after readiness is then
measured separately: `first_vs_tenth`). It prints

1. per step, per bucket: the mean step time of each engine for each (batch, kind of step) — "cached" is a step
   after a block's first forward with a KV cache, "full" a whole-canvas forward — and compiled ÷ eager;
2. end to end: seconds per row, compiled ÷ eager, and each engine's dual ÷ none;
3. warm-up: cold (an empty TORCHINDUCTOR_CACHE_DIR) and warm (a fresh process on the filled cache);
4. token identity: every output of the compiled engine equals the eager one at temperature 0.

Usage: python benchmarks/compiled.py [--gen-length 256] [--prompts 2] [--quick] [--json F]
(--quick: gen 64, one prompt, batch 1 and 2: a smoke run, numbers mean little.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

BLOCK = 32
WARM_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from engine import DiffusionEngine, SchedulerConfig
from engine.warm_up import WarmUpPlan
config = SchedulerConfig(max_batch_size={batch})
engine = DiffusionEngine.from_pretrained(None, device="cpu", compile=True, scheduler_config=config)
print(engine.warm_up(WarmUpPlan(**{plan!r})))
"""


def rows(gen: int) -> list[tuple[str, dict]]:
    one = dict(gen_length=gen, block_length=BLOCK, num_denoising_steps=gen, early_exit=False)
    threshold = dict(gen_length=gen, block_length=BLOCK, confidence_threshold=0.9, early_exit=False)
    return [
        ("none, 1 token/step", dict(one, kv_cache="none")),
        ("prefix, 1 token/step", dict(one, kv_cache="prefix")),
        ("dual, 1 token/step", dict(one, kv_cache="dual")),
        ("none, τ 0.9", dict(threshold, kv_cache="none")),
        ("dual, τ 0.9", dict(threshold, kv_cache="dual")),
    ]


class StepTimer:
    """Wraps engine.step: the wall time of each step by (batch, kind)."""

    def __init__(self, engine):
        self.engine, self.real_step = engine, engine.step
        self.seconds: dict[tuple[int, str], list[float]] = defaultdict(list)
        engine.step = self.step

    def step(self, requests):
        kind = "cached" if any(r.uses_kv_cache and r.block_step > 0 for r in requests) else "full"
        started = time.perf_counter()
        events = self.real_step(requests)
        self.seconds[(len(requests), kind)].append(time.perf_counter() - started)
        return events


def run_batch(engine, prompts: list[list[int]], params) -> tuple[float, list[list[int]]]:
    """Step `prompts` together to the end (what the scheduler does with them); seconds and canvases."""
    requests = [engine.new_request(prompt_token_ids=ids, params=params) for ids in prompts]
    started = time.perf_counter()
    while not all(r.finished for r in requests):
        engine.step([r for r in requests if not r.finished])
    return time.perf_counter() - started, [r.result.canvas_ids for r in requests]


def warm_up_in_fresh_process(cache_dir: str, batch: int, plan: dict) -> float:
    code = WARM_CHILD.format(root=str(ROOT), batch=batch, plan=plan)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per row (each at batch 1 and in a batch)")
    parser.add_argument("--quick", action="store_true", help="gen 64, one prompt, batch 1 and 2: a smoke run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    gen, n_prompts, big = (64, 1, 2) if args.quick else (args.gen_length, args.prompts, 8)

    cache_dir = tempfile.mkdtemp(prefix="dllm-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir  # before torch loads: a cold cache for this run
    import torch  # noqa: F401

    from engine import DiffusionEngine, SamplingParams, SchedulerConfig
    from engine.warm_up import WarmUpPlan
    from scripts.tiny_chat_corpus import heldout_examples

    config = SchedulerConfig(max_batch_size=big)
    eager = DiffusionEngine.from_pretrained(None, device="cpu", compile=False, scheduler_config=config)
    compiled = DiffusionEngine.from_pretrained(None, device="cpu", compile=True, scheduler_config=config)
    prompts = [eager.tokenizer.encode_chat(e.messages) for e in heldout_examples()[:n_prompts]]
    plan = dict(
        batch_sizes=(1, big), kv_cache=("none", "prefix", "dual"), prompt_tokens=len(prompts[0]), gen_length=gen
    )
    cold = compiled.warm_up(WarmUpPlan(**plan))
    eager.warm_up(WarmUpPlan(**plan))
    warm = warm_up_in_fresh_process(cache_dir, big, plan)
    print(f"embedded model, CPU threads {torch.get_num_threads()}, gen {gen}, block {BLOCK}, prompts {n_prompts}")
    print(f"warm-up (batch 1 and {big}, none, prefix and dual): cold {cold:.1f} s, warm disk cache {warm:.1f} s "
          f"(fresh process), {compiled.stats.snapshot()['dllm_compiled_shapes']} shapes")  # fmt: skip

    timers = {"eager": StepTimer(eager), "compiled": StepTimer(compiled)}
    engines = {"eager": eager, "compiled": compiled}
    seconds: dict[tuple[str, int, str], float] = defaultdict(float)
    first: dict[str, float] = {}
    identical = True
    for name, kwargs in rows(gen):
        params = SamplingParams(**kwargs)
        for batch in (1, big):
            groups = [[p] for p in prompts] if batch == 1 else [[prompts[i % n_prompts] for i in range(big)]]
            for label, engine in engines.items():  # one untimed pass: shapes warm-up did not cover compile here
                spent, _ = run_batch(engine, groups[0], params)
                if label == "compiled" and "first" not in first:  # the first request after warm-up
                    first["first"] = spent
            for index, group in enumerate(groups):
                order = list(engines.items()) if index % 2 == 0 else list(engines.items())[::-1]
                outputs = {}
                for label, engine in order:
                    spent, outputs[label] = run_batch(engine, group, params)
                    seconds[(name, batch, label)] += spent
                identical &= outputs["eager"] == outputs["compiled"]
    first_row = SamplingParams(**rows(gen)[0][1])
    tenth = [run_batch(compiled, prompts[:1], first_row)[0] for _ in range(10)][-1]  # the same request, 10th time

    print("\n1. per step, by bucket (mean ms): eager, compiled, compiled speed-up (eager ÷ compiled)")
    per_step = {}
    for key in sorted(set(timers["eager"].seconds) & set(timers["compiled"].seconds)):
        e = sum(timers["eager"].seconds[key]) / len(timers["eager"].seconds[key])
        c = sum(timers["compiled"].seconds[key]) / len(timers["compiled"].seconds[key])
        per_step[f"batch {key[0]} {key[1]}"] = dict(eager_ms=e * 1e3, compiled_ms=c * 1e3, speedup=e / c)
        print(f"  batch {key[0]:>2} {key[1]:<6}  {e * 1e3:8.2f}  {c * 1e3:8.2f}  {e / c:5.2f}x")
    print("\n2. end to end (s): eager, compiled, speed-up; dual ÷ none is each engine's cache speed-up")
    end_to_end = {}
    for batch in (1, big):
        for name, _ in rows(gen):
            e, c = seconds[(name, batch, "eager")], seconds[(name, batch, "compiled")]
            end_to_end[f"batch {batch} {name}"] = dict(eager_s=e, compiled_s=c, speedup=e / c)
            print(f"  batch {batch:>2} {name:<22} {e:8.2f}  {c:8.2f}  {e / c:5.2f}x")
        for label in engines:
            none, dual = seconds[(rows(gen)[0][0], batch, label)], seconds[(rows(gen)[2][0], batch, label)]
            print(f"  batch {batch:>2} {label}: dual is {none / dual:.2f}x as fast as none (1 token/step)")
            end_to_end[f"batch {batch} {label} dual vs none"] = none / dual
    print(f"\n3. warm-up: cold {cold:.1f} s, warm cache {warm:.1f} s; first compiled request after warm-up "
          f"{first['first']:.2f} s vs the tenth {tenth:.2f} s; recompiles while serving: "
          f"{compiled.stats.snapshot()['dllm_compile_recompiles_total']}")  # fmt: skip
    print(f"4. tokens identical to eager at temperature 0, every row and batch: {identical}")
    if args.json:
        summary = dict(per_step=per_step, end_to_end=end_to_end, warm_up_cold_s=cold, warm_up_warm_s=warm,
                       first_s=first["first"], tenth_s=tenth, identical=identical)  # fmt: skip
        args.json.write_text(json.dumps(summary, indent=2))
    eager.shutdown()
    compiled.shutdown()


if __name__ == "__main__":
    main()
