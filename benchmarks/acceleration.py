"""Acceleration at quality parity: reference loop vs engine, early exit, LocalLeap, schedules, metrics.

On the embedded model's held-out prompts, in one run, for each canvas setting (pure diffusion: one
block; semi-autoregressive: small blocks), every row reports exact-match accuracy, mean forward passes
per request, answer tokens/s, and ratios to the reference row of its setting. Before timing anything
it asserts that the engine (batch 1, early exit off) produces exactly the reference loop's tokens.

Usage: python benchmarks/acceleration.py [--limit 120] [--model DIR] [--plot docs/accuracy_vs_passes.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.reference_loop import reference_generate  # noqa: E402
from engine import DiffusionEngine, SamplingParams  # noqa: E402
from scripts.tiny_chat_corpus import heldout_examples  # noqa: E402

# (label, gen_length, block_length, steps); steps = gen_length is the reference quality setting.
SETTINGS = [
    ("pure diffusion, gen 32", 32, 32, 32),
    ("semi-AR, gen 32 block 8", 32, 8, 32),
    ("pure diffusion, gen 64", 64, 64, 64),
    ("semi-AR, gen 64 block 16", 64, 16, 64),
]

BASELINE_ROW = "engine b1, no early exit"  # timed interleaved with the reference loop

LOCAL_LEAP_SWEEP = [  # (κ, τ, W) around the paper's default (0.9, 0.75, 4)
    (0.8, 0.6, 4),
    (0.95, 0.85, 4),
    (0.9, 0.75, 8),
]


@dataclass
class Row:
    setting: str
    name: str
    accuracy: float
    mean_passes: float
    tokens_per_second: float
    seconds: float
    speedup: float = 1.0
    passes_ratio: float = 1.0


def engine_rows(gen: int, block: int, steps: int) -> list[tuple[str, dict]]:
    base = dict(gen_length=gen, block_length=block, num_denoising_steps=steps)
    rows = [
        (BASELINE_ROW, dict(base, early_exit=False)),
        ("+ early exit", dict(base)),
        ("+ LocalLeap (0.9/0.75/4)", dict(base, use_local_leap=True)),
    ]
    for kappa, tau, radius in LOCAL_LEAP_SWEEP:
        leap = dict(
            use_local_leap=True,
            local_leap_anchor_threshold=kappa,
            local_leap_neighbor_threshold=tau,
            local_leap_radius=radius,
        )
        rows.append((f"+ LocalLeap ({kappa}/{tau}/{radius})", dict(base, **leap)))
    rows.append(("entropy_inverse + early exit", dict(base, confidence_metric="entropy_inverse")))
    half = dict(base, num_denoising_steps=steps // 2)  # schedules only differ when a step commits > 1 token
    for schedule in ("uniform", "front_loaded", "cosine"):
        rows.append((f"half steps, {schedule}", dict(half, block_schedule=schedule)))
    return rows


def exact(text: str, answer: str) -> bool:
    return text.strip() == answer


def run_reference_and_engine(engine, examples, gen, block, steps):
    """The reference loop and the engine (batch 1, early exit off) on each prompt in turn, so that
    background load on a shared machine hits both alike. Returns both outputs and both times."""
    params = SamplingParams(gen_length=gen, block_length=block, num_denoising_steps=steps, early_exit=False)
    ref_canvases, ref_passes, ref_seconds = [], 0, 0.0
    results, engine_seconds = [], 0.0
    for e in examples:
        prompt = engine.tokenizer.encode_chat(e.messages)
        start = time.perf_counter()
        canvas, forwards = reference_generate(
            engine.model, prompt, gen_length=gen, block_length=block, steps=steps, mask_id=engine.tokenizer.mask_id
        )
        middle = time.perf_counter()
        results.append(engine.generate(messages=e.messages, params=params))
        engine_seconds += time.perf_counter() - middle
        ref_seconds += middle - start
        ref_canvases.append(canvas)
        ref_passes += forwards
    return ref_canvases, ref_passes, ref_seconds, results, engine_seconds


def cut(engine, canvas: list[int]) -> list[int]:
    stops = [i for i, t in enumerate(canvas) if t in engine.tokenizer.stop_ids]
    return canvas[: stops[0]] if stops else canvas


def measure(engine, examples, setting, gen, block, steps) -> list[Row]:
    ref_canvases, ref_passes, ref_seconds, baseline, baseline_seconds = run_reference_and_engine(
        engine, examples, gen, block, steps
    )
    mismatches = sum(r.canvas_ids != c for r, c in zip(baseline, ref_canvases))
    assert mismatches == 0, f"{setting}: engine differs from the reference loop on {mismatches} prompts"
    ref_answers = [cut(engine, c) for c in ref_canvases]
    ref_texts = [engine.tokenizer.decode(a) for a in ref_answers]
    tokens = sum(len(a) for a in ref_answers)
    reference = Row(
        setting,
        "reference loop (official)",
        accuracy=sum(exact(t, e.answer) for t, e in zip(ref_texts, examples)) / len(examples),
        mean_passes=ref_passes / len(examples),
        tokens_per_second=tokens / ref_seconds,
        seconds=ref_seconds,
    )
    rows = [reference]
    for name, kwargs in engine_rows(gen, block, steps):
        if name == BASELINE_ROW:
            results, seconds = baseline, baseline_seconds
        else:
            params = SamplingParams(**kwargs)
            start = time.perf_counter()
            results = [engine.generate(messages=e.messages, params=params) for e in examples]
            seconds = time.perf_counter() - start
        if name == "+ early exit":
            assert [r.token_ids for r in results] == ref_answers, "early exit changed an answer"
        passes = sum(r.num_forward_passes for r in results) / len(examples)
        rows.append(
            Row(
                setting,
                name,
                accuracy=sum(exact(r.text, e.answer) for r, e in zip(results, examples)) / len(examples),
                mean_passes=passes,
                tokens_per_second=sum(r.completion_tokens for r in results) / seconds,
                seconds=seconds,
                speedup=ref_seconds / seconds,
                passes_ratio=passes / reference.mean_passes,
            )
        )
    return rows


def print_table(rows: list[Row]) -> None:
    header = f"| {'setting':26} | {'row':30} | accuracy | passes | × passes | tokens/s | speedup |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(
            f"| {r.setting:26} | {r.name:30} | {100 * r.accuracy:7.1f}% | {r.mean_passes:6.1f} | "
            f"{r.passes_ratio:8.2f} | {r.tokens_per_second:8.1f} | {r.speedup:6.2f}× |"
        )


def row_kind(name: str) -> tuple[str, str]:
    """Legend label and marker of a row: the kind of acceleration it measures."""
    if name.startswith("reference"):
        return "reference loop", "s"
    if "LocalLeap" in name:
        return "LocalLeap (any κ/τ/W)", "^"
    if name.startswith("half steps"):
        return "half the steps (any schedule)", "x"
    return "engine, early exit on/off, either metric", "o"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    settings = list(dict.fromkeys(r.setting for r in rows))
    colors = dict(zip(settings, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for r in rows:
        _, marker = row_kind(r.name)
        ax.scatter(r.mean_passes, 100 * r.accuracy, color=colors[r.setting], marker=marker, s=40, alpha=0.8)
    for setting, color in colors.items():  # legend: colour = setting, marker = kind of row
        ax.scatter([], [], color=color, marker="o", label=setting)
    for label, marker in dict(row_kind(r.name) for r in rows).items():
        ax.scatter([], [], color="grey", marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("mean forward passes per request (log scale; fewer is faster)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_title("Embedded model: accuracy vs forward passes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: the embedded model)")
    ap.add_argument("--limit", type=int, default=120, help="held-out prompts per setting")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "accuracy_vs_passes.png")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    engine = DiffusionEngine.from_pretrained(args.model, device="cpu")
    examples = heldout_examples(args.limit)
    engine.generate(messages=examples[0].messages, params=SamplingParams(gen_length=32))  # warm-up
    rows: list[Row] = []
    print(f"model {engine.model_name}, {len(examples)} held-out prompts, {torch.get_num_threads()} threads")
    for setting, gen, block, steps in SETTINGS:
        rows += measure(engine, examples, setting, gen, block, steps)
        print(f"measured: {setting}", flush=True)
    print_table(rows)
    if args.plot:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))


if __name__ == "__main__":
    main()
