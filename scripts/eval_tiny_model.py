"""Exact-match evaluation of a chat model on the held-out split of the synthetic corpus.

Runs held-out prompts through the engine's offline API (`DiffusionEngine.new_request` + `step`, i.e.
what `generate` does, with several requests sharing each forward pass; rows of a batch compute what they
would alone) and prints exact-match accuracy per task family and overall, then the conversation rows:
the same task prompts under held-out system prompts and after an earlier exchange, the task prompts that
use number words, small talk, and other prompts (the help answer). Also: mean forward passes, tokens/s
and the share of answers that ended with end-of-turn/EOS (finish_reason "stop").

Usage: python scripts/eval_tiny_model.py [--model DIR] [--gen-length 32 --block-length 32 --steps 32
       --temperature 0 --use-local-leap] [--limit N] [--rows tasks] [--quantize int8]
       (--rows tasks: the task rows only; --quantize: none, int8 or int4 weights, engine/quantization.py)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Spinning OpenMP threads slow everything down 10x when the two cores are shared (see train_tiny_model.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `scripts` and `engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from scripts.tiny_chat_corpus import (  # noqa: E402
    NUMBER_WORDS,
    TASK_FAMILIES,
    Example,
    heldout_examples,
    heldout_system_prompts,
)


def with_system_prompt(examples: list[Example]) -> list[Example]:
    """Each example behind a held-out system prompt (assigned in turn)."""
    systems = heldout_system_prompts()
    return [
        Example([{"role": "system", "content": systems[i % len(systems)]}, *e.messages], e.answer, e.family)
        for i, e in enumerate(examples)
    ]


def after_earlier_exchange(examples: list[Example]) -> list[Example]:
    """Each example after another held-out example's exchange (its prompt and correct answer)."""
    out = []
    for i, e in enumerate(examples):
        earlier = examples[(i + 1) % len(examples)]
        turn = [*earlier.messages, {"role": "assistant", "content": earlier.answer}]
        out.append(Example([*turn, *e.messages], e.answer, e.family))
    return out


def uses_number_words(example: Example) -> bool:
    words = example.messages[-1]["content"].lower().replace("?", " ").replace(".", " ").split()
    return any(w in NUMBER_WORDS for w in words)


def evaluation_rows(limit: int) -> dict[str, list[Example]]:
    """Row name -> prompts: one row per task family, then the conversation rows (all held out)."""
    tasks = heldout_examples(limit)
    rows = {family: [e for e in tasks if e.family == family] for family in TASK_FAMILIES}
    rows["tasks (all)"] = tasks
    rows["tasks, system prompt"] = with_system_prompt(tasks)
    rows["tasks, earlier turn"] = after_earlier_exchange(tasks)
    rows["number words"] = [e for e in tasks if uses_number_words(e)]
    rows["small talk"] = heldout_examples(10_000, families=("small_talk",))
    rows["help (other)"] = heldout_examples(10_000, families=("help",))
    rows["help, system prompt"] = with_system_prompt(rows["help (other)"])
    return rows


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
    ap.add_argument("--quantize", default="none", help="weight-only quantization: none, int8, int4")
    ap.add_argument("--dtype", default=None, help="model dtype (default float32 on the CPU)")
    ap.add_argument("--rows", choices=("all", "tasks"), default="all", help="tasks: skip the conversation rows")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu", dtype=args.dtype, quantize=args.quantize)
    params = SamplingParams(
        gen_length=args.gen_length,
        block_length=args.block_length,
        num_denoising_steps=args.steps,
        temperature=args.temperature,
        seed=args.seed,
        use_local_leap=args.use_local_leap,
    )
    leap = "on" if params.use_local_leap else "off"
    print(
        f"model {engine.model_name}: gen {params.gen_length}, block {params.block_length}, "
        f"{params.num_denoising_steps} steps, T={params.temperature}, LocalLeap {leap}, "
        f"{next(engine.model.parameters()).dtype}, quantization {engine.quantization}"
    )
    report(engine, params, args.limit, args.batch, tasks_only=args.rows == "tasks")


def report(
    engine: DiffusionEngine, params: SamplingParams, limit: int, batch: int, tasks_only: bool = False
) -> dict[str, float]:
    """Print one line per evaluation row; returns row -> exact-match share."""
    print(f"{'row':22s} {'n':>4s} {'exact':>7s} {'stop':>7s}")
    scores: dict[str, float] = {}
    answered: dict[tuple, object] = {}  # "tasks (all)" and "number words" reuse the per-family results
    tokens, seconds, results_all = 0, 0.0, []
    rows = evaluation_rows(limit)
    if tasks_only:
        rows = {name: rows[name] for name in (*TASK_FAMILIES, "tasks (all)")}
    for name, examples in rows.items():
        needed = max(len(engine.tokenizer.encode_text(e.answer)) + 1 for e in examples)  # + end of turn
        if needed > params.gen_length:
            print(f"{name:22s} {len(examples):4d}  (answers need a {needed}-token canvas)")
            continue
        todo = [e for e in examples if (e.key, e.answer) not in answered]
        start = time.perf_counter()
        for e, r in zip(todo, run(engine, todo, params, batch)):
            answered[(e.key, e.answer)] = r
            tokens += r.completion_tokens
            results_all.append(r)
        seconds += time.perf_counter() - start
        results = [answered[(e.key, e.answer)] for e in examples]
        scores[name] = sum(r.text.strip() == e.answer for e, r in zip(examples, results)) / len(examples)
        stops = sum(r.finish_reason == "stop" for r in results) / len(examples)
        print(f"{name:22s} {len(examples):4d} {scores[name]:7.1%} {stops:7.1%}", flush=True)
    passes = sum(r.num_forward_passes for r in results_all) / len(results_all)
    print(f"mean forward passes {passes:.1f}")
    print(f"tokens/s            {tokens / seconds:.1f}  ({tokens} tokens, {seconds:.1f} s, batch {batch})")
    return scores


if __name__ == "__main__":
    main()
