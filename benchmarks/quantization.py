"""Weight-only quantization on this machine: bytes, peak memory at load, speed and agreement, none vs int8 vs int4.

    python benchmarks/quantization.py [--json quant.json] [--eval] [--threads 1]

In one run, for each setting (none, int8, int4; bfloat16 throughout, the dtype a quantized model loads in):
1. weight bytes of the quantized layers (the linear layers of the transformer blocks) vs the same in bf16,
   for the embedded model (models/tiny-llada-chat);
2. peak resident memory while loading (the highest of 3 loads), in a fresh process per setting, for the
   embedded model and for a synthetic 8-layer LLaDA checkpoint of 0.1 B parameters in bf16 (written to a
   temporary directory), large enough that its weights, not the libraries, dominate: streaming
   quantization should keep the peak near the quantized size;
3. time per forward of the embedded model (a batch-1 canvas and a batch of 32) and end to end (32 prompts,
   batched, KV cache + threshold decoding), as ratios to none: medians of interleaved rounds;
4. agreement of generated tokens with none on the fixture checkpoints and the embedded model, with the same
   requests (KV cache + threshold + batching where the family has a KV cache), and for scale the agreement
   of none-in-bfloat16 with none-in-float32;
5. with --eval: the embedded model's evaluation (scripts/eval_tiny_model.py's held-out task prompts) per
   setting: accuracy, and the share of answers identical to none's.
CPU numbers on a shared 2-core machine: compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from engine.loading import EMBEDDED_MODEL_DIR, transformer_blocks  # noqa: E402
from engine.quantization import weight_bytes  # noqa: E402

MODES = ("none", "int8", "int4")
FIXTURES = {
    "llada-tiny": ROOT / "tests" / "fixtures" / "llada-tiny",
    "dream-tiny": ROOT / "tests" / "fixtures" / "dream-tiny",
    "tiny-llada-chat": EMBEDDED_MODEL_DIR,
}


# --- agreement (also used by tests/test_quantization.py) ------------------------------------------------------


def agreement_prompts(engine: DiffusionEngine, count: int = 16, length: int = 8, seed: int = 0) -> list[list[int]]:
    """Random prompts of ordinary (non-special) token ids, the same for every engine on one checkpoint."""
    generator = torch.Generator().manual_seed(seed)
    special = {engine.model.config.mask_token_id, engine.model.config.eos_token_id, engine.model.config.pad_token_id}
    high = min(256, engine.model.config.vocab_size)  # byte-level ids exist in every tokenizer here
    prompts = []
    while len(prompts) < count:
        ids = torch.randint(0, high, (length,), generator=generator).tolist()
        if not special & set(ids):
            prompts.append(ids)
    return prompts


def agreement_params(engine: DiffusionEngine) -> SamplingParams:
    """Greedy, the whole canvas kept (no early exit), threshold decoding, and the KV cache where it exists."""
    kv_cache = "prefix" if engine.family == "llada" else "none"  # Dream has no KV cache yet
    return SamplingParams(
        gen_length=32, block_length=8, confidence_threshold=0.9, kv_cache=kv_cache, early_exit=False, temperature=0.0
    )


def generate_batched(engine: DiffusionEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Every prompt's canvas, all requests stepped together through shared forwards (batching)."""
    requests = [engine.new_request(prompt_token_ids=p, params=params) for p in prompts]
    done: dict[int, list[int]] = {}
    while len(done) < len(requests):
        live = [(i, r) for i, r in enumerate(requests) if i not in done]
        for (i, _), event in zip(live, engine.step([r for _, r in live])):
            if isinstance(event, Exception):
                raise event
            if event.finished:
                done[i] = list(event.result.token_ids)
    return [done[i] for i in range(len(requests))]


def token_agreement(reference: list[list[int]], other: list[list[int]], width: int) -> float:
    """Share of the canvas positions (each row padded to `width`) where both runs produced the same token."""
    same = 0
    for a, b in zip(reference, other, strict=True):
        a, b = a + [-1] * (width - len(a)), b + [-1] * (width - len(b))
        same += sum(x == y for x, y in zip(a, b))
    return same / (width * len(reference))


def measure_agreement(path: Path, modes=MODES) -> dict[str, float]:
    """Agreement with none (bf16) of each mode, plus "none-float32": bf16's own distance from float32."""
    base = DiffusionEngine.from_pretrained(path, device="cpu", dtype=torch.bfloat16, quantize="none")
    prompts, params = agreement_prompts(base), agreement_params(base)
    reference = generate_batched(base, prompts, params)
    out = {}
    for mode in modes:
        if mode == "none":
            continue
        engine = DiffusionEngine.from_pretrained(path, device="cpu", dtype=torch.bfloat16, quantize=mode)
        out[mode] = token_agreement(reference, generate_batched(engine, prompts, params), params.gen_length)
    fp32 = DiffusionEngine.from_pretrained(path, device="cpu", dtype=torch.float32, quantize="none")
    out["none-float32"] = token_agreement(reference, generate_batched(fp32, prompts, params), params.gen_length)
    return out


# --- peak memory at load, in a fresh process ----------------------------------------------------------------

# The baseline is taken after every import the load makes (torchao for all settings, so that none is not
# charged for imports the quantized settings made before it, and a load of another checkpoint to warm up
# lazy imports). After "done", one forward touches every weight: an unquantized bf16 load maps the file and
# reads pages only when the forward does, so its memory shows then, not during the load.
LOAD_CHILD = """
import sys, torch
from pathlib import Path
import torchao.quantization
from engine.loading import load_model
load_model(Path(sys.argv[3]), "cpu", torch.bfloat16, compile=False, quantize=sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
model = load_model(Path(sys.argv[1]), "cpu", torch.bfloat16, compile=False, quantize=sys.argv[2])
print("done", flush=True)
sys.stdin.readline()
with torch.inference_mode():
    model(torch.zeros(1, 8, dtype=torch.long))
print("forward", flush=True)
sys.stdin.readline()
"""


def _status_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0])
    return fields


def peak_load_memory(model_dir: Path, mode: str) -> dict[str, float]:
    """MiB above the after-imports baseline, at the peak, while a fresh process loads `model_dir`.

    Sampled from outside (every millisecond) so that the loader's own thread is not slowed. RssAnon is the
    process's own memory; VmRSS adds the checkpoint's memory-mapped pages, which the kernel can drop.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    warm_up = FIXTURES["llada-tiny"]
    child = subprocess.Popen(
        [sys.executable, "-c", LOAD_CHILD, str(model_dir), mode, str(warm_up)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert child.stdout.readline().strip() == "ready"
    base = _status_kib(child.pid)
    peak = dict(base)
    finished = threading.Event()

    def wait_done():
        child.stdout.readline()
        finished.set()

    reader = threading.Thread(target=wait_done, daemon=True)
    child.stdin.write("go\n")
    child.stdin.flush()
    reader.start()
    while not finished.is_set():
        for key, value in _status_kib(child.pid).items():
            peak[key] = max(peak[key], value)
        time.sleep(0.001)
    after = _status_kib(child.pid)
    child.stdin.write("forward\n")
    child.stdin.flush()
    child.stdout.readline()
    after_forward = _status_kib(child.pid)
    child.stdin.write("exit\n")
    child.stdin.flush()
    child.wait(timeout=60)
    return {
        "peak_anon_mib": (peak["RssAnon"] - base["RssAnon"]) / 1024,
        "peak_rss_mib": (peak["VmRSS"] - base["VmRSS"]) / 1024,
        "after_load_rss_mib": (after["VmRSS"] - base["VmRSS"]) / 1024,
        "after_forward_rss_mib": (after_forward["VmRSS"] - base["VmRSS"]) / 1024,
    }


def write_synthetic_checkpoint(directory: Path) -> Path:
    """An 8-layer LLaDA checkpoint (d_model 1024, MLP 4096: 0.1 B parameters in the blocks) in bf16, random."""
    from safetensors.torch import save_file

    from engine.config import LLaDAConfig
    from engine.model import LLaDAModelLM

    config = LLaDAConfig(d_model=1024, n_heads=8, n_kv_heads=8, n_layers=8, mlp_hidden_size=4096, vocab_size=1088)
    with torch.device("meta"):
        names = {name: p.shape for name, p in LLaDAModelLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    tensors = {
        name: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16) for name, shape in names.items()
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config.to_dict()))
    return directory


# --- speed -------------------------------------------------------------------------------------------------


def time_forward(engine: DiffusionEngine, batch: int, length: int, iters: int) -> float:
    ids = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for _ in range(3):
            engine.model(ids)
        start = time.perf_counter()
        for _ in range(iters):
            engine.model(ids)
    return (time.perf_counter() - start) / iters


def time_end_to_end(engine: DiffusionEngine) -> tuple[float, int]:
    prompts = agreement_prompts(engine, count=32, length=16, seed=2)
    params = agreement_params(engine)
    generate_batched(engine, prompts[:2], params)  # warm-up
    start = time.perf_counter()
    canvases = generate_batched(engine, prompts, params)
    return time.perf_counter() - start, sum(len(c) for c in canvases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    parser.add_argument("--eval", action="store_true", help="also run the embedded model's evaluation per setting")
    parser.add_argument("--eval-limit", type=int, default=400, help="held-out task prompts for --eval")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for the timings")
    parser.add_argument("--iters", type=int, default=20, help="forwards per timing")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (the median is reported)")
    parser.add_argument("--memory-repeats", type=int, default=3, help="loads per memory measurement (the peak)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report: dict = {"torch": torch.__version__, "threads": args.threads, "dtype": "bfloat16"}

    print("1. weight bytes of the quantized layers (the blocks' linear layers), embedded model, vs bf16")
    engines = {m: DiffusionEngine.from_pretrained(None, device="cpu", dtype=torch.bfloat16, quantize=m) for m in MODES}
    report["weight_bytes"] = {}
    for mode, engine in engines.items():
        summary = weight_bytes(engine.model, transformer_blocks(engine.model))
        report["weight_bytes"][mode] = {
            "layers": summary.layers,
            "quantized_layers": summary.quantized_layers,
            "bytes": summary.loaded_bytes,
            "ratio_to_bf16": summary.ratio_to_bf16,
            "model_bytes": summary.model_bytes,
        }
        print(f"   {mode:5s} {summary.quantized_layers:3d}/{summary.layers} layers  {summary.loaded_bytes:>9,d} B  "
              f"{summary.ratio_to_bf16:6.1%} of bf16   whole model {summary.model_bytes:>9,d} B")  # fmt: skip

    print("\n2. peak memory while loading, MiB above the process's memory after its imports (fresh process each)")
    report["load_memory"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        synthetic = write_synthetic_checkpoint(Path(tmp) / "llada-synthetic")
        size = (synthetic / "model.safetensors").stat().st_size / 2**20
        for label, path in (("embedded", EMBEDDED_MODEL_DIR), (f"synthetic {size:.0f} MiB bf16", synthetic)):
            report["load_memory"][label] = {}
            for mode in MODES:
                # The highest of a few loads: a peak sampled every millisecond can only be missed, not inflated.
                runs = [peak_load_memory(path, mode) for _ in range(args.memory_repeats)]
                row = {key: max(r[key] for r in runs) for key in runs[0]}
                report["load_memory"][label][mode] = row
                print(f"   {label:24s} {mode:5s} load: peak anon {row['peak_anon_mib']:6.1f}, peak RSS "
                      f"{row['peak_rss_mib']:6.1f}, RSS after {row['after_load_rss_mib']:6.1f}; "
                      f"RSS after a forward {row['after_forward_rss_mib']:6.1f}")  # fmt: skip

    print(f"\n3. speed, embedded model, {args.threads} thread(s): ms per forward and end to end, the median of "
          f"{args.repeats} interleaved rounds; ratio = none's time / the mode's (above 1: faster)")  # fmt: skip
    rounds: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):  # interleaved, so that the machine's load drifts over all settings alike
        for mode, engine in engines.items():
            e2e_s, tokens = time_end_to_end(engine)
            rounds[mode].append(
                {
                    "forward_1x64_ms": time_forward(engine, 1, 64, args.iters) * 1e3,
                    "forward_32x64_ms": time_forward(engine, 32, 64, max(3, args.iters // 4)) * 1e3,
                    "e2e_s": e2e_s,
                    "e2e_tokens": tokens,
                }
            )
    report["speed"] = {
        mode: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for mode, runs in rounds.items()
    }
    none = report["speed"]["none"]
    for mode, row in report["speed"].items():
        for key in ("forward_1x64_ms", "forward_32x64_ms", "e2e_s"):
            row[f"{key}_speed_vs_none"] = none[key] / row[key]
        speed = lambda key, row=row: f"{row[key + '_speed_vs_none']:.2f}x"  # noqa: E731
        print(f"   {mode:5s} forward 1x64 {row['forward_1x64_ms']:6.2f} ms ({speed('forward_1x64_ms')})"
              f"  32x64 {row['forward_32x64_ms']:7.1f} ms ({speed('forward_32x64_ms')})"
              f"  e2e 32 requests {row['e2e_s']:6.2f} s ({speed('e2e_s')})")  # fmt: skip

    print("\n4. generated tokens identical to none (bf16), same requests; none-float32 = bf16's own distance")
    report["agreement"] = {}
    for name, path in FIXTURES.items():
        row = measure_agreement(path)
        report["agreement"][name] = row
        print(f"   {name:16s} " + "  ".join(f"{mode} {share:6.1%}" for mode, share in row.items()))

    if args.eval:
        from scripts.eval_tiny_model import heldout_examples, run

        examples = heldout_examples(args.eval_limit)
        params = SamplingParams(gen_length=32)  # the evaluation's defaults: one block, 32 steps, greedy
        print(f"\n5. the embedded model's evaluation: {len(examples)} held-out task prompts (scripts/eval_tiny_model.py"
              f", gen 32, greedy, batches of 32): exact-match accuracy, and answers identical to none's")  # fmt: skip
        report["eval"] = {}
        answers: dict[str, list[str]] = {}
        for mode, engine in engines.items():
            start = time.perf_counter()
            answers[mode] = [r.text.strip() for r in run(engine, examples, params, 32)]
            seconds = time.perf_counter() - start
            accuracy = sum(a == e.answer for a, e in zip(answers[mode], examples)) / len(examples)
            identical = sum(a == b for a, b in zip(answers[mode], answers["none"])) / len(examples)
            report["eval"][mode] = {"accuracy": accuracy, "identical_to_none": identical, "seconds": seconds}
            print(f"   {mode:5s} accuracy {accuracy:6.1%}  identical to none {identical:6.1%}  "
                  f"({seconds:.1f} s, {report['eval']['none']['seconds'] / seconds:.2f}x none's speed)")  # fmt: skip

    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
