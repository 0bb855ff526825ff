"""One request stepped on the main thread, then on a second thread of the same process: the OpenMP cost of
stepping on a thread other than the one that first ran torch's parallel kernels.

    python benchmarks/second_thread.py                            # torch's default threads (one per core)
    OMP_WAIT_POLICY=ACTIVE python benchmarks/second_thread.py
    OMP_NUM_THREADS=1 python benchmarks/second_thread.py          # what the server sets unless told otherwise
    python benchmarks/second_thread.py --after-warm-up            # engine.warm_up() first, then the 2nd thread

The engine's scheduler steps on its own thread (engine/scheduler.py) while the main thread loaded the model.
libgomp keeps a team of worker threads per thread that has run a parallel region; once the threads it manages
outnumber the cores, it makes every worker sleep almost at once after each region ("throttled" spinning), so
each of a step's few hundred small regions pays a wake-up. The embedded model, eager, one dual-cache request
(gen 256, blocks of 32, one token per step), medians of `--reps` runs on each thread, and their ratio.
`--after-warm-up` runs the engine's warm-up instead of the main thread's steps: it steps on a thread of its
own that takes its team with it when it ends, so the second thread should keep the main thread's speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.compiled import run_batch  # noqa: E402
from engine import DiffusionEngine, SamplingParams  # noqa: E402
from engine.warm_up import WarmUpPlan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--after-warm-up", action="store_true", help="engine.warm_up() instead of main-thread steps")
    args = parser.parse_args()
    engine = DiffusionEngine.from_pretrained(None, device="cpu", compile=False)
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "What is 3 plus 4?"}])
    params = SamplingParams(gen_length=256, block_length=32, num_denoising_steps=256, kv_cache="dual",
                            temperature=0.0, early_exit=False)  # fmt: skip

    def seconds() -> list[float]:
        spent = [run_batch(engine, [prompt], params)[0] for _ in range(args.reps + 1)]
        return spent[1:]  # the first run warms up

    if args.after_warm_up:
        engine.warm_up(WarmUpPlan(batch_sizes=(1,), kv_cache=("dual",)))
    on_main = None if args.after_warm_up else statistics.median(seconds())
    on_second: list[float] = []
    worker = threading.Thread(target=lambda: on_second.extend(seconds()))
    worker.start()
    worker.join()
    second = statistics.median(on_second)
    if on_main is None:
        print(f"torch threads {torch.get_num_threads()}: after engine.warm_up(), second thread {second:.3f} s")
    else:
        print(f"torch threads {torch.get_num_threads()}: main thread {on_main:.3f} s, second thread {second:.3f} s, "
              f"second ÷ main {second / on_main:.2f}x")  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
