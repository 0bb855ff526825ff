"""The engine at LLaDA-8B (or Dream-7B) scale on one GPU: forward throughput, end-to-end tokens/s, overhead, memory.

    python benchmarks/gpu.py --device cuda --json gpu.json     # the real run (about 2 minutes on an H200)
    python benchmarks/gpu.py --family dream --device cuda      # the same at Dream-7B / DiffuCoder-7B shapes
    python benchmarks/gpu.py --family llada2 --device cuda     # LLaDA2-mini's shapes: the cached block step
    python benchmarks/gpu.py --tiny [--family dream]           # smoke check on CPU (< 60 s; numbers mean nothing)
    python benchmarks/gpu.py --device cuda --quantize int4      # the same with int4 (or int8, fp8) weights

The model has LLaDA-8B-Instruct's (or Dream-v0-Instruct-7B's) exact config and random weights, built directly
on the device (nothing is downloaded): speed depends on shapes, not on weight values. In one run it measures

1. the device's dense matrix rate (a big square matmul in the model dtype): the ceiling for everything else;
2. the model forward vs batch size × canvas length, as latency and achieved TFLOP/s;
3. end-to-end generation through the async API and its scheduler thread (gen 256, block 32, 256 steps:
   one token per forward) at concurrency 1 and 8, the share of wall time spent outside the model forward
   (sampler + scheduler overhead), and peak GPU memory per request;
4. the same requests with Fast-dLLM's KV cache, prefix and dual, against none (LLaDA and Dream; on Dream a
   cached block's first forward commits its first position only, then one token per forward as well).
With --quantize int8 | int4 | fp8 the blocks' linear layers are quantized after the random weights are drawn,
as loading does (engine/quantization.py): the weight bytes, the forward and the end to end then measure the
quantized kernels. The FLOP count stays that of the unquantized model (weight-only quantization changes the
bytes read, not the multiply-adds), so "of rate" compares against the bf16 matmul rate.

FLOPs per forward (a multiply-add is 2 FLOPs), for B rows of T positions and N candidate positions in all,
with P = P_blocks / L the linear weights of one block and P_kv those of its key and value projections:

    2 · P · B·T · (L − 1)           linear layers of every block but the last (P_blocks = 6.98 B in all for
                                    LLaDA-8B, 6.53 B for Dream-7B)
  + 2 · P_kv · B·T + 2 · (P − P_kv) · N    the last block: keys and values everywhere, the rest at candidates
  + 4 · d · T · (T · B · (L − 1) + N)     attention: QKᵀ and the weighted sum of V (last block: N queries)
  + 2 · d · V · N                   the LM head, applied at the N candidate positions only

Dream's shifted logits move the last block's queries and the head one column left, not their number.
Embedding lookups, norms, RoPE, activations and Dream's q/k/v biases are not counted (memory-bound, small).
"Ceiling" below is FLOPs / measured matmul rate: no forward can be faster than that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from engine import DiffusionEngine, SamplingParams, SchedulerConfig  # noqa: E402
from engine.config import DreamConfig, LLaDAConfig, ModelConfig  # noqa: E402
from engine.loading import (  # noqa: E402
    MODEL_CLASSES,
    DiffusionLM,
    compile_model,
    default_dtype,
    dtype_from_name,
    transformer_blocks,
)
from engine.model import LogitIndex  # noqa: E402
from engine.quantization import (  # noqa: E402
    QUANTIZE_MODES,
    check_quantization,
    quantize_block,
    quantized_dtype,
    weight_bytes,
)
from engine.tokenizer import ChatTokenizer  # noqa: E402

# Only their tokenizers are used (engine requests need one); the prompts are token ids, so the vocabulary
# size does not matter (ids a tokenizer does not know decode to nothing).
TOKENIZER_DIRS = {
    "llada": ROOT / "tests" / "fixtures" / "llada-tiny",
    "dream": ROOT / "tests" / "fixtures" / "dream-tiny",
}

# GSAI-ML/LLaDA-8B-Instruct's config.json, the keys that set the shapes.
LLADA_8B = LLaDAConfig(
    d_model=4096,
    n_heads=32,
    n_kv_heads=32,
    n_layers=32,
    mlp_hidden_size=12288,
    vocab_size=126464,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_sequence_length=4096,
)
# The same architecture shrunk until a CPU runs the whole benchmark in seconds (special ids < vocab).
TINY = replace(
    LLADA_8B, d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=192, vocab_size=448,
    max_sequence_length=512, mask_token_id=402, eos_token_id=401, pad_token_id=401,
)  # fmt: skip
# Dream-org/Dream-v0-Instruct-7B's config.json (Qwen2.5-7B's shapes; DiffuCoder-7B has the same), the keys
# that set the shapes, and its special ids.
DREAM_7B = DreamConfig(
    hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28, intermediate_size=18944,
    vocab_size=152064, mask_token_id=151666, eos_token_id=151643, pad_token_id=151643, rms_norm_eps=1e-6,
    rope_theta=1000000.0, max_sequence_length=131072,
)  # fmt: skip
TINY_DREAM = replace(
    DREAM_7B, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    intermediate_size=192, vocab_size=448, mask_token_id=402, eos_token_id=401, pad_token_id=401,
    max_sequence_length=512,
)  # fmt: skip
MODEL_NAMES = {"llada": "LLaDA-8B", "dream": "Dream-7B"}


@dataclass(frozen=True)
class Plan:
    """What to measure: the real plan, or a tiny one that walks the same code path quickly."""

    config: ModelConfig
    matmul_size: int
    batches: tuple[int, ...]
    canvases: tuple[int, ...]
    warmup: int  # untimed forwards per shape (cuBLAS heuristics, allocator, lazy init)
    iters: int  # timed forwards per shape
    block_length: int  # candidates per row in the forward sweep: a block at its first step
    prompt_length: int
    gen_length: int
    steps: int
    concurrencies: tuple[int, ...]
    target_shape: tuple[int, int]  # (batch, canvas) where the forward target applies


FULL = Plan(LLADA_8B, 8192, (1, 4, 8, 16), (256, 512, 1024), 2, 5, 32, 64, 256, 256, (1, 8), (8, 512))
SMOKE = Plan(TINY, 256, (1, 4, 8, 16), (64, 128), 1, 2, 32, 16, 64, 64, (1, 8), (8, 128))
PLANS = {  # (family, tiny) → plan: the Dream plans measure the same shapes of work on Dream's model
    ("llada", False): FULL,
    ("llada", True): SMOKE,
    ("dream", False): replace(FULL, config=DREAM_7B),
    ("dream", True): replace(SMOKE, config=TINY_DREAM),
}

# Targets of issue 7 (docs/gpu.md): met or missed is printed, nothing fails on them.
TARGET_FORWARD_SHARE_OF_CEILING = 0.50
TARGET_MAX_OVERHEAD = 0.10
TARGET_CONCURRENCY_SPEEDUP = 5.0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> DiffusionLM:
    """The config's model with random weights, allocated once, on the device, in `dtype` (no fp32 or host copy)."""
    with torch.device("meta"):
        model = MODEL_CLASSES[type(config)](config)
    model = model.to(dtype).to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()  # Dream's q/k/v biases
            elif param.dim() == 1:
                param.fill_(1.0)  # RMSNorm scales
            else:
                param.normal_(std=0.02)  # keeps activations in a sane range through 32 layers
    return model.eval().requires_grad_(False)


def block_weight_count(model: DiffusionLM) -> int:
    """P_blocks: weights of the linear layers inside the transformer blocks (norm scales and biases excluded)."""
    return sum(p.numel() for p in transformer_blocks(model).parameters() if p.dim() == 2)


def shapes(config: ModelConfig) -> tuple[int, int, int]:
    """(layers, model width, key/value width) under either family's names."""
    if isinstance(config, DreamConfig):
        kv_width = config.num_key_value_heads * config.head_dim
        return config.num_hidden_layers, config.hidden_size, kv_width
    return config.n_layers, config.d_model, config.n_kv_heads * config.head_dim


def forward_flops(config: ModelConfig, p_blocks: int, batch: int, canvas: int, candidates: float) -> float:
    """`candidates`: N, over the whole batch (the formula is in this module's docstring)."""
    layers, d, kv_width = shapes(config)
    positions = batch * canvas
    per_block = p_blocks / layers
    key_value = 2 * d * kv_width
    linear = 2 * per_block * positions * (layers - 1) + 2 * key_value * positions
    linear += 2 * (per_block - key_value) * candidates
    attention = 4 * d * canvas * (canvas * batch * (layers - 1) + candidates)
    head = 2 * d * config.vocab_size * candidates
    return float(linear + attention + head)


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int, iters: int = 20) -> float:
    """Dense matmul FLOP/s in the model dtype: the practical peak the forward is compared against."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * size**3 * iters / (time.perf_counter() - start)


def forward_inputs(config: ModelConfig, device: torch.device, batch: int, canvas: int, candidates: int, padded=False):
    """Random ids, an optional left-padding mask, and the last `candidates` positions of each row."""
    ids = torch.randint(0, config.vocab_size, (batch, canvas), device=device)
    mask = None
    if padded:  # the first row is the shortest request of the batch: a quarter of its canvas is padding
        mask = torch.ones(batch, canvas, dtype=torch.long, device=device)
        mask[0, : canvas // 4] = 0
    columns = torch.arange(canvas - candidates, canvas, device=device).repeat(batch, 1)
    return ids, mask, LogitIndex(columns)


@torch.inference_mode()
def time_forward(model, device, inputs, warmup: int, iters: int) -> float:
    """Seconds per forward, wall clock from the host (kernel launch overhead included, as in serving)."""
    ids, mask, index = inputs
    for _ in range(warmup):
        model(ids, mask, logit_index=index)
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        model(ids, mask, logit_index=index)
    sync(device)
    return (time.perf_counter() - start) / iters


@torch.inference_mode()
def attention_kernels(model, config, device) -> dict[str, str]:
    """The first fused SDPA kernel (flash, cuDNN, memory-efficient) that accepts an unpadded and a padded
    batch of this model, tried one at a time with every other kernel forbidden.

    Unpadded batches pass no mask, so flash should take them; padded batches pass a boolean key mask,
    which flash refuses and the memory-efficient (or cuDNN) kernel takes in bf16. "math" means only the
    slow unfused kernel, which materialises the T×T scores, accepts the inputs.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    result = {}
    for case, padded in (("unpadded", False), ("padded", True)):
        ids, mask, index = forward_inputs(config, device, 2, 64, 4, padded=padded)
        result[case] = "math"
        for name, kernel in kernels.items():
            try:
                with sdpa_kernel([kernel]), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SDPA explains each refusal in a warning
                    model(ids, mask, logit_index=index)
            except RuntimeError:
                continue
            result[case] = name
            break
    return result


@torch.inference_mode()
def warm_up(model, config, device) -> float:
    """The first forward of each kind that compiles separately: batch 1, batch ≥ 2, and padded."""
    start = time.perf_counter()
    for batch, padded in ((1, False), (2, False), (2, True)):
        ids, mask, index = forward_inputs(config, device, batch, 64, 4, padded=padded)
        model(ids, mask, logit_index=index)
    sync(device)
    return time.perf_counter() - start


class ForwardClock:
    """Device time of every model forward, measured without adding a host-device synchronisation.

    CUDA events are recorded on the stream around each forward (forward hooks); they are read only after
    the run. On CPU the host clock is the device clock.
    """

    def __init__(self, model: DiffusionLM, device: torch.device):
        self.device = device
        self.marks: list[tuple] = []
        self._handles = [model.register_forward_pre_hook(self._start), model.register_forward_hook(self._end)]

    def _mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))  # the stream the forward's kernels go to
            return event
        return time.perf_counter()

    def _start(self, module, args):
        self._pending = self._mark()

    def _end(self, module, args, output):
        self.marks.append((self._pending, self._mark()))

    def total_s(self) -> float:
        sync(self.device)
        if self.device.type == "cuda":
            return sum(start.elapsed_time(end) for start, end in self.marks) / 1000
        return sum(end - start for start, end in self.marks)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def end_to_end(model, tokenizer, device, plan: Plan, concurrency: int, kv_cache: str = "none") -> dict:
    """`concurrency` identical requests submitted together through the async API, one token per forward."""
    # A fresh engine per run: its scheduler admits exactly `concurrency` requests and waits (briefly) for
    # all of them, so every forward of the run is one batch of `concurrency` rows.
    name = f"{type(plan.config).__name__}-random"
    engine = DiffusionEngine(
        model, tokenizer, device, name, SchedulerConfig(max_batch_size=concurrency, max_wait_ms=1000)
    )
    params = SamplingParams(
        gen_length=plan.gen_length,
        block_length=plan.block_length,
        num_denoising_steps=plan.steps,
        block_schedule="uniform",  # one token per forward for both families (Dream's own commits 0 at first)
        early_exit=False,  # random weights emit EOS anywhere: keep the work per request fixed
        kv_cache=kv_cache,
    )
    generator = torch.Generator().manual_seed(concurrency)
    special = {tokenizer.mask_id, *tokenizer.stop_ids}
    prompts = []
    for _ in range(concurrency):
        ids = torch.randint(0, plan.config.vocab_size, (plan.prompt_length,), generator=generator).tolist()
        prompts.append([i if i not in special else 0 for i in ids])

    step_seconds: list[float] = []
    real_step = engine.step

    def timed_step(requests):  # runs on the scheduler thread; ends with the step's one synchronisation
        start = time.perf_counter()
        events = real_step(requests)
        step_seconds.append(time.perf_counter() - start)
        return events

    engine.step = timed_step

    async def run_all():
        return await asyncio.gather(*(engine.agenerate(prompt_token_ids=p, params=params) for p in prompts))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base_memory = torch.cuda.memory_allocated(device)
    clock = ForwardClock(model, device)
    try:
        start = time.perf_counter()
        results = asyncio.run(run_all())
        wall = time.perf_counter() - start
        forward_s = clock.total_s()
    finally:
        clock.remove()
        engine.shutdown()
    step_s = sum(step_seconds)
    tokens = sum(len(r.canvas_ids) for r in results)
    row = {
        "concurrency": concurrency,
        "kv_cache": kv_cache,
        "kv_cache_mib_per_request": engine.new_request(prompt_token_ids=prompts[0], params=params).kv_cache_bytes
        / 2**20,
        "prompt_length": plan.prompt_length,
        "gen_length": plan.gen_length,
        "block_length": plan.block_length,
        "steps": plan.steps,
        "forwards": len(clock.marks),
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "forward_s": forward_s,
        "step_s": step_s,
        # Shares of the run's wall time: outside = everything that is not the model forward.
        "outside_forward_share": 1 - forward_s / wall,
        "sampler_share": (step_s - forward_s) / wall,  # batch building, transfers, propose/commit, decode
        "scheduler_share": (wall - step_s) / wall,  # the scheduler loop, event delivery, asyncio
        "peak_mib_per_request": None,
        "canvases": [r.canvas_ids for r in results],  # for the compiled-vs-eager identity check; not in --json
    }
    if device.type == "cuda":
        row["peak_mib_per_request"] = (torch.cuda.max_memory_allocated(device) - base_memory) / concurrency / 2**20
    return row


def without_canvases(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "canvases"}


def compiled_vs_eager(model, tokenizer, device, plan: Plan) -> list[dict]:
    """--compile: end to end with the eager forward, then with the compiled one (engine/compiled.py: CUDA graphs
    per shape bucket on CUDA, inductor on CPU), same requests, kv_cache none and dual; ratios and token identity.
    Each compiled configuration runs once untimed first: its buckets compile (and are captured) there."""
    rows = []
    for concurrency in plan.concurrencies:
        for mode in ("none", "dual") if isinstance(plan.config, LLaDAConfig) else ("none",):  # Dream: no cache
            static = getattr(model, "_static_shapes", None)
            object.__delattr__(model, "_static_shapes")  # eager for this row
            eager = end_to_end(model, tokenizer, device, plan, concurrency, mode)
            object.__setattr__(model, "_static_shapes", static)
            end_to_end(model, tokenizer, device, plan, concurrency, mode)  # compiles this row's buckets
            compiled = end_to_end(model, tokenizer, device, plan, concurrency, mode)
            rows.append(
                {
                    "concurrency": concurrency,
                    "kv_cache": mode,
                    "eager_s": eager["wall_s"],
                    "compiled_s": compiled["wall_s"],
                    "speedup": eager["wall_s"] / compiled["wall_s"],
                    "identical": eager["canvases"] == compiled["canvases"],
                    "compiled_shapes": len(static.shapes),
                }
            )
    return rows


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny config, few iterations: a smoke check (CPU)")
    parser.add_argument("--family", choices=["llada", "dream", "llada2"], default="llada",
                        help="LLaDA-8B, Dream-7B or LLaDA2-mini shapes")  # fmt: skip
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 (default on cuda) or float32 (default on cpu)")
    parser.add_argument(
        "--compile", action="store_true", help="also compare the compiled forward (CUDA graphs) with eager, end to end"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    parser.add_argument(
        "--quantize", choices=QUANTIZE_MODES, default="none", help="weight-only quantization of the blocks' linears"
    )
    args = parser.parse_args()
    if args.family == "llada2":  # a block-diffusion MoE: its own plan (the cached block step)
        from benchmarks.gpu_llada2 import run_llada2

        return run_llada2(args)

    plan = PLANS[(args.family, args.tiny)]
    device = torch.device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda"))
    dtype = quantized_dtype(args.quantize, dtype_from_name(args.dtype) if args.dtype else None) or default_dtype(device)
    try:
        check_quantization(args.quantize, device, dtype, setting="--quantize")
    except ValueError as error:
        parser.error(str(error))
    config = plan.config
    torch.set_grad_enabled(False)
    if args.tiny and device.type == "cpu":
        # Tiny shapes gain nothing from threads, and on a shared CPU OpenMP's spinning barriers turn
        # contention into 30x slowdowns: one thread keeps the smoke check fast and steady.
        torch.set_num_threads(1)

    model = random_model(config, device, dtype)
    p_blocks = block_weight_count(model)
    p_total = model.num_parameters()
    if args.quantize != "none":
        for block in transformer_blocks(model):
            quantize_block(block, args.quantize)
    quantized = weight_bytes(model, transformer_blocks(model))
    weights_mib = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else None
    backends = attention_kernels(model, config, device)  # eager: before any compilation
    warmup_s = warm_up(model, config, device)  # eager: --compile compares both, end to end (below)
    rate = matmul_rate(device, dtype, plan.matmul_size)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device} ({device_name})  dtype: {str(dtype).removeprefix('torch.')}  quantize: {args.quantize}  "
          f"compile: {'on' if args.compile else 'off'}  model: {'tiny ' if args.tiny else ''}"
          f"{MODEL_NAMES[args.family]} config, "
          f"{count(p_total)} params ({count(p_blocks)} in blocks), random weights")  # fmt: skip
    if args.tiny:
        print("SMOKE CHECK (--tiny): exercises the code path only; these numbers are not performance claims")
    print(f"matmul rate: {rate / 1e12:.2f} TFLOP/s ({plan.matmul_size}³ in {str(dtype).removeprefix('torch.')})")
    print(f"warm-up: {warmup_s:.2f} s (first forwards: batch 1, batch 2, batch 2 padded"
          f"{'; includes compilation' if args.compile else ''})")  # fmt: skip
    print(f"attention: SDPA kernel accepted for an unpadded batch: {backends['unpadded']}, "
          f"for a padded batch: {backends['padded']}")  # fmt: skip
    if weights_mib is not None:
        print(f"weights: {weights_mib:.0f} MiB on the device")
    print(f"block linear weights: {quantized.loaded_bytes / 2**20:.1f} MiB, {quantized.ratio_to_bf16:.0%} of bf16 "
          f"({quantized.quantized_layers} of {quantized.layers} layers quantized: {args.quantize})")  # fmt: skip

    print(f"\nforward sweep ({plan.block_length} candidate positions per row, no padding)")
    print(f"{'':8}{'batch':>6}{'canvas':>8}{'ms':>10}{'TFLOP/s':>10}{'of rate':>9}{'ceiling ms':>12}")
    forward_rows = []
    for batch in plan.batches:
        for canvas in plan.canvases:
            inputs = forward_inputs(config, device, batch, canvas, plan.block_length)
            seconds = time_forward(model, device, inputs, plan.warmup, plan.iters)
            flops = forward_flops(config, p_blocks, batch, canvas, batch * plan.block_length)
            row = {
                "batch": batch,
                "canvas": canvas,
                "candidates": batch * plan.block_length,
                "ms": seconds * 1e3,
                "flops": flops,
                "tflops": flops / seconds / 1e12,
                "share_of_rate": flops / seconds / rate,
                "ceiling_ms": flops / rate * 1e3,
            }
            forward_rows.append(row)
            print(f"{'forward':8}{batch:>6}{canvas:>8}{row['ms']:>10.2f}{row['tflops']:>10.2f}"
                  f"{row['share_of_rate']:>9.0%}{row['ceiling_ms']:>12.2f}")  # fmt: skip

    canvas = plan.prompt_length + plan.gen_length
    print(f"\nend to end (async API + scheduler): prompt {plan.prompt_length}, gen {plan.gen_length}, "
          f"block {plan.block_length}, {plan.steps} steps = 1 token per forward, canvas {canvas}")  # fmt: skip
    print(f"{'':8}{'conc':>5}{'forwards':>9}{'wall s':>9}{'tok/s':>10}{'vs 1':>7}{'ceil tok/s':>11}"
          f"{'outside fwd':>12}{'sampler':>9}{'sched':>7}{'MiB/req':>9}")  # fmt: skip
    tokenizer = ChatTokenizer.from_pretrained(TOKENIZER_DIRS[args.family], config)
    end_to_end(model, tokenizer, device, replace(plan, gen_length=plan.block_length, steps=plan.block_length), 1)
    e2e_rows = []
    for concurrency in plan.concurrencies:
        row = end_to_end(model, tokenizer, device, plan, concurrency)
        # At one token per forward the ceiling is `concurrency` tokens per (FLOPs / rate); the LM head
        # sees (block_length + 1) / 2 candidates per row on average over a block.
        mean_candidates = concurrency * (plan.block_length + 1) / 2
        row["ceiling_tokens_per_s"] = (
            concurrency * rate / forward_flops(config, p_blocks, concurrency, canvas, mean_candidates)
        )
        row["speedup_vs_1"] = row["tokens_per_s"] / e2e_rows[0]["tokens_per_s"] if e2e_rows else 1.0
        e2e_rows.append(row)
        print(f"{'e2e':8}{concurrency:>5}{row['forwards']:>9}{row['wall_s']:>9.2f}{row['tokens_per_s']:>10.1f}"
              f"{row['speedup_vs_1']:>6.1f}x{row['ceiling_tokens_per_s']:>11.0f}{row['outside_forward_share']:>12.1%}"
              f"{row['sampler_share']:>9.1%}{row['scheduler_share']:>7.1%}"
              f"{fmt(row['peak_mib_per_request'], '.0f'):>9}")  # fmt: skip

    cache_rows = []
    if args.family in ("llada", "dream"):  # Fast-dLLM's cache (block diffusion has its own, always on)
        print(f"\nKV cache (Fast-dLLM), end to end, same requests: gen {plan.gen_length}, block {plan.block_length}, "
              f"1 token per forward; MiB/req = the cache one request holds")  # fmt: skip
        print(f"{'':8}{'mode':>7}{'conc':>5}{'wall s':>9}{'tok/s':>10}{'vs none':>9}{'cache MiB/req':>14}"
              f"{'peak MiB/req':>13}")  # fmt: skip
        for concurrency in plan.concurrencies:
            none = next(r for r in e2e_rows if r["concurrency"] == concurrency)
            for mode in ("none", "prefix", "dual"):
                row = none if mode == "none" else end_to_end(model, tokenizer, device, plan, concurrency, mode)
                row = {**row, "speedup_vs_none": row["tokens_per_s"] / none["tokens_per_s"]}
                cache_rows.append(row)
                print(f"{'kv':8}{mode:>7}{concurrency:>5}{row['wall_s']:>9.2f}{row['tokens_per_s']:>10.1f}"
                      f"{row['speedup_vs_none']:>8.2f}x{row['kv_cache_mib_per_request']:>14.1f}"
                      f"{fmt(row['peak_mib_per_request'], '.0f'):>13}")  # fmt: skip

    compile_rows = []
    if args.compile:  # last: the model stays compiled, and the cache rows above are eager's
        compile_model(model)
        mode = "CUDA graphs per bucket" if device.type == "cuda" else "inductor, CPU"
        print(f"\ncompiled forward ({mode}) vs eager, end to end, same requests; identical = same tokens")
        print(f"{'':8}{'mode':>7}{'conc':>5}{'eager s':>9}{'compiled s':>11}{'speed-up':>9}{'identical':>10}")
        for row in compiled_vs_eager(model, tokenizer, device, plan):
            compile_rows.append(row)
            print(f"{'compile':8}{row['kv_cache']:>7}{row['concurrency']:>5}{row['eager_s']:>9.2f}"
                  f"{row['compiled_s']:>11.2f}{row['speedup']:>8.2f}x{str(row['identical']):>10}")  # fmt: skip

    target_row = next(r for r in forward_rows if (r["batch"], r["canvas"]) == plan.target_shape)
    busiest = e2e_rows[-1]
    targets = {
        "forward_share_of_rate": (target_row["share_of_rate"], TARGET_FORWARD_SHARE_OF_CEILING),
        "outside_forward_share": (busiest["outside_forward_share"], TARGET_MAX_OVERHEAD),
        "concurrency_speedup": (busiest["speedup_vs_1"], TARGET_CONCURRENCY_SPEEDUP),
    }
    met = {
        "forward_share_of_rate": targets["forward_share_of_rate"][0] >= TARGET_FORWARD_SHARE_OF_CEILING,
        "outside_forward_share": targets["outside_forward_share"][0] <= TARGET_MAX_OVERHEAD,
        "concurrency_speedup": targets["concurrency_speedup"][0] >= TARGET_CONCURRENCY_SPEEDUP,
    }
    note = " (--tiny: not meaningful)" if args.tiny else ""
    verdict = lambda key: "met" if met[key] else "MISSED"  # noqa: E731
    batch, width = plan.target_shape
    print(f"\ntargets{note}")
    print(f"  forward at batch {batch} × {width}: {targets['forward_share_of_rate'][0]:.0%} of the matmul rate "
          f"(target ≥ {TARGET_FORWARD_SHARE_OF_CEILING:.0%}): {verdict('forward_share_of_rate')}")  # fmt: skip
    print(f"  outside the forward at concurrency {busiest['concurrency']}: "
          f"{busiest['outside_forward_share']:.1%} of wall time (target ≤ {TARGET_MAX_OVERHEAD:.0%}): "
          f"{verdict('outside_forward_share')}")  # fmt: skip
    print(f"  concurrency {busiest['concurrency']} vs 1: {busiest['speedup_vs_1']:.1f}x tokens/s "
          f"(target ≥ {TARGET_CONCURRENCY_SPEEDUP:.0f}x): {verdict('concurrency_speedup')}")  # fmt: skip

    if args.json:
        report = {
            "smoke_check_only": args.tiny,
            "device": str(device),
            "device_name": device_name,
            "dtype": str(dtype).removeprefix("torch."),
            "compile": args.compile,
            "quantize": args.quantize,
            "block_weight_bytes": quantized.loaded_bytes,
            "block_weight_ratio_to_bf16": quantized.ratio_to_bf16,
            "quantized_layers": quantized.quantized_layers,
            "family": args.family,
            "torch": torch.__version__,
            "config": asdict(config),
            "params_total": p_total,
            "params_blocks": p_blocks,
            "weights_mib": weights_mib,
            "matmul_size": plan.matmul_size,
            "matmul_tflops": rate / 1e12,
            "warmup_s": warmup_s,
            "attention_kernels": backends,
            "forward": forward_rows,
            "end_to_end": [without_canvases(r) for r in e2e_rows],
            "kv_cache": [without_canvases(r) for r in cache_rows],
            "compiled_vs_eager": compile_rows,
            "targets": {k: {"value": v, "target": t, "met": met[k]} for k, (v, t) in targets.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
