"""LLaDA2-mini's shapes on one GPU: what a step of the exact block KV cache costs, at batch 1 and 8.

Run through benchmarks/gpu.py (`--family llada2`). The model is LLaDA2.1-mini's exact config
(benchmarks/llada2_shapes.py: 16.3 B parameters, 1.4 B active per token, 256 experts top-8) with random bf16
weights built on the device. For each batch size and prompt length, requests at LLaDA2.0's one token per forward
(blocks of 32, EOS never stops them) are stepped through the engine's batched block step
(engine/block_step.py):

- prefill: a request's first forward, which computes its prompt and first block and fills its cache;
- cached step: every later forward inside the block computes the current block's 32 positions per row against
  the cache (the prompt's keys are read, not recomputed). Median and fastest over the timed steps;
- official step: what the official `generate()` runs for the same token, one forward over the whole prefix
  [0, block end) with the block-causal mask and the LM head at every position, for one request (it has no
  batching: at batch N it runs N of them). "× official" = N × official step / cached step.

FLOPs of a cached step, for R rows of 32 computed positions and N candidates (the LM head's rows):
2 · (active weights in the layers) · R·32 + 4 · L · H·head_dim · R·32 · K (attention over K cached keys)
+ 2 · d · V · N. With top-8 of 256 experts a block of 32 tokens already touches most experts, so a step at
small batch reads most of the 32 GB of weights: it is bound by memory (and by one small matmul per expert
per layer), not by arithmetic; the table shows how far from the matmul rate that leaves it.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from benchmarks.gpu import count, matmul_rate, sync
from benchmarks.llada2_shapes import LLADA2_MINI, LLADA2_TINY, TokenIds, parameter_counts, random_llada2, random_prompt
from engine import DiffusionEngine, SamplingParams
from engine.config import LLaDA2Config
from engine.llada2 import block_causal_mask
from engine.loading import compile_model, default_dtype, dtype_from_name

BLOCK = 32


@dataclass(frozen=True)
class Plan:
    config: LLaDA2Config
    matmul_size: int
    batches: tuple[int, ...]
    prompts: tuple[int, ...]  # prompt lengths, multiples of the block: the first block is all answer
    gen_length: int
    warmup_steps: int  # untimed cached steps after the prefill
    timed_steps: int  # warmup + timed ≤ 31: all inside the first block


FULL = Plan(LLADA2_MINI, 8192, (1, 8), (64, 1024), 256, 3, 12)
SMOKE = Plan(LLADA2_TINY, 256, (1, 8), (32, 64), 64, 1, 3)


@dataclass
class StepRow:
    batch: int
    prompt: int
    prefill_ms: float  # median over the batch's prefill forwards (one per batch)
    step_ms: float  # median cached step (all rows together)
    fastest_step_ms: float
    step_ms_per_request: float
    tokens_per_s: float  # one token per row per step
    official_step_ms: float  # one request's uncached forward over the prefix
    vs_official: float  # batch × official / cached
    step_tflops: float
    share_of_rate: float
    kv_cache_mib_per_request: float
    peak_mib_per_request: float | None


def step_flops(config: LLaDA2Config, batch: int, keys: int) -> float:
    """A cached step at one token per forward: `batch` rows of one block each, candidates = the block's masks
    (B at the first step, 1 at the last: (B + 1) / 2 on average), attention over `keys` columns."""
    total, active = parameter_counts(config)
    embeddings = 2 * config.vocab_size * config.hidden_size  # the embedding table and the LM head
    positions = batch * BLOCK
    linear = 2 * (active - embeddings) * positions
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * positions * keys
    head = 2 * config.hidden_size * config.vocab_size * batch * (BLOCK + 1) / 2
    return float(linear + attention + head)


def timed(device, fn) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


@torch.inference_mode()
def official_step_seconds(model, config: LLaDA2Config, device, prompt: int, repeats: int) -> float:
    """One official forward for the first answer block: the whole prefix, every position's logits."""
    end = prompt + BLOCK
    ids = torch.tensor([random_prompt(config, prompt, seed=7) + [config.mask_token_id] * BLOCK], device=device)
    mask = block_causal_mask(end, BLOCK, device)[None, None]
    model(ids, attention_mask=mask)  # warm-up of this shape
    return statistics.median(timed(device, lambda: model(ids, attention_mask=mask)) for _ in range(repeats))


def step_row(engine: DiffusionEngine, plan: Plan, batch: int, prompt: int, official_s: float, rate: float) -> StepRow:
    config, device = engine.model.config, engine.device
    params = SamplingParams(gen_length=plan.gen_length, block_length=BLOCK, num_denoising_steps=plan.gen_length)
    requests = [
        engine.new_request(prompt_token_ids=random_prompt(config, prompt, seed=i), params=params) for i in range(batch)
    ]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)

    def step():
        for event in engine.step(requests):
            if isinstance(event, Exception):
                raise event

    prefill = timed(device, step)
    for _ in range(plan.warmup_steps):
        step()
    steps = [timed(device, step) for _ in range(plan.timed_steps)]
    assert all(r.forward_span()[1] == prompt + BLOCK for r in requests), "the timed steps left the first block"
    median = statistics.median(steps)
    flops = step_flops(config, batch, prompt + BLOCK)
    peak = None
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated(device) - base) / batch / 2**20
    row = StepRow(
        batch=batch,
        prompt=prompt,
        prefill_ms=prefill * 1e3,
        step_ms=median * 1e3,
        fastest_step_ms=min(steps) * 1e3,
        step_ms_per_request=median * 1e3 / batch,
        tokens_per_s=batch / median,
        official_step_ms=official_s * 1e3,
        vs_official=batch * official_s / median,
        step_tflops=flops / median / 1e12,
        share_of_rate=flops / median / rate,
        kv_cache_mib_per_request=requests[0].kv_cache_bytes / 2**20,
        peak_mib_per_request=peak,
    )
    for request in requests:
        request.release()
    return row


def run_llada2(args) -> None:
    """benchmarks/gpu.py's `--family llada2`: the same flags (--tiny, --device, --dtype, --compile, --json)."""
    plan = SMOKE if args.tiny else FULL
    device = torch.device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda"))
    dtype = dtype_from_name(args.dtype) if args.dtype else default_dtype(device)
    torch.set_grad_enabled(False)
    if args.tiny and device.type == "cpu":
        torch.set_num_threads(1)  # as in gpu.py: tiny shapes gain nothing from threads on a shared CPU
    config = plan.config
    model = random_llada2(config, device, dtype)
    if args.compile:
        compile_model(model)
    total, active = parameter_counts(config)
    weights_mib = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else None
    rate = matmul_rate(device, dtype, plan.matmul_size)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    engine = DiffusionEngine(model, TokenIds(config), device, "llada2-random")

    print(f"device: {device} ({device_name})  dtype: {str(dtype).removeprefix('torch.')}  "
          f"compile: {'on' if args.compile else 'off'}  model: {'tiny ' if args.tiny else ''}LLaDA2-mini config "
          f"(llada2_moe, {config.num_experts} experts top-{config.num_experts_per_tok}), {count(total)} params, "
          f"{count(active)} active per token, random weights")  # fmt: skip
    if args.tiny:
        print("SMOKE CHECK (--tiny): exercises the code path only; these numbers are not performance claims")
    print(f"matmul rate: {rate / 1e12:.2f} TFLOP/s ({plan.matmul_size}³ in {str(dtype).removeprefix('torch.')})")
    if weights_mib is not None:
        print(f"weights: {weights_mib:.0f} MiB on the device")
    try:
        print(f"\nblock step (exact KV cache), LLaDA2.0 at 1 token per forward, block {BLOCK}, gen {plan.gen_length}; "
              f"official = one uncached forward over the prefix per request")  # fmt: skip
        print(f"{'':7}{'batch':>6}{'prompt':>7}{'prefill ms':>11}{'step ms':>9}{'fastest':>9}{'ms/req':>8}"
              f"{'tok/s':>9}{'official ms':>12}{'x official':>11}{'TFLOP/s':>9}{'of rate':>8}{'KV MiB/req':>11}"
              f"{'peak MiB/req':>13}")  # fmt: skip
        rows = []
        for prompt in plan.prompts:
            official = official_step_seconds(model, config, device, prompt, repeats=plan.timed_steps)
            for batch in plan.batches:
                row = step_row(engine, plan, batch, prompt, official, rate)
                rows.append(row)
                peak = "-" if row.peak_mib_per_request is None else f"{row.peak_mib_per_request:.0f}"
                print(f"{'llada2':7}{batch:>6}{prompt:>7}{row.prefill_ms:>11.2f}{row.step_ms:>9.2f}"
                      f"{row.fastest_step_ms:>9.2f}{row.step_ms_per_request:>8.2f}{row.tokens_per_s:>9.1f}"
                      f"{row.official_step_ms:>12.2f}{row.vs_official:>10.2f}x{row.step_tflops:>9.2f}"
                      f"{row.share_of_rate:>8.1%}{row.kv_cache_mib_per_request:>11.1f}{peak:>13}")  # fmt: skip
    finally:
        engine.shutdown()
    for prompt in plan.prompts:
        one, most = (next(r for r in rows if r.prompt == prompt and r.batch == b) for b in (1, plan.batches[-1]))
        print(f"prompt {prompt}: batch {most.batch} vs 1: {most.tokens_per_s / one.tokens_per_s:.2f}x tokens/s, "
              f"a step costs {most.step_ms / one.step_ms:.2f}x")  # fmt: skip
    if args.json:
        report = {
            "smoke_check_only": args.tiny,
            "family": "llada2",
            "device": str(device),
            "device_name": device_name,
            "dtype": str(dtype).removeprefix("torch."),
            "compile": args.compile,
            "torch": torch.__version__,
            "config": asdict(config),
            "params_total": total,
            "params_active_per_token": active,
            "weights_mib": weights_mib,
            "matmul_tflops": rate / 1e12,
            "block_step": [asdict(r) for r in rows],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
