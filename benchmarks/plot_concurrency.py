"""Throughput vs concurrency from `benchmarks/batching.py --json` runs (LocalLeap off and on), one PNG.

Usage: python benchmarks/plot_concurrency.py OFF.json ON.json [--out docs/throughput_vs_concurrency.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="JSON files written by benchmarks/batching.py --json")
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "throughput_vs_concurrency.png"
    )
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in args.runs:
        run = json.loads(path.read_text())
        rows = run["rows"]
        label = "LocalLeap" if run["use_local_leap"] else "no LocalLeap"
        concurrency = [r["n"] for r in rows]
        ax.plot(concurrency, [r["con_tps"] for r in rows], marker="o", label=f"batched, {label}")
        ax.plot(concurrency, [r["seq_tps"] for r in rows], marker="x", linestyle="--", label=f"one by one, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("canvas tokens / s")
    ax.set_title("Embedded model on a 2-core CPU: step-level batching × LocalLeap")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
