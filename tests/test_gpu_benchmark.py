"""The GPU path, checked on CPU: the benchmark script runs, loading never widens a bf16 checkpoint, the
device side of a step never waits for the device, bf16 padded batches use a mask SDPA accepts, and the
compile switch is wired. No timing assertions: this machine's numbers mean nothing for a GPU.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine import DiffusionEngine, SamplingParams
from engine.batch import denoise_step
from engine.compiled import static_shapes_of
from engine.config import LLaDAConfig
from engine.dream import DreamModelLM
from engine.kv_slots import kv_slots
from engine.loading import MODEL_CLASSES, compile_from_env, load_model
from engine.model import LLaDAModelLM
from tests.fixture_paths import FIXTURE_DIR, REPO_ROOT

HANG_GUARD_S = 300  # turns a hang into a failure; the script takes seconds


def run_gpu_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/gpu.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


# --- benchmarks/gpu.py --tiny: the script that measures the GPU must not rot ----------------------------


@pytest.mark.slow  # the script, in a subprocess
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_gpu_benchmark_tiny_runs_and_prints_its_table(tmp_path, family):
    out = tmp_path / "gpu.json"
    done = run_gpu_script("--tiny", "--family", family, "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("SMOKE CHECK") for line in lines)  # never mistaken for a performance claim
    assert any(line.startswith("matmul rate:") for line in lines)
    forward_rows = [line.split() for line in lines if re.match(r"forward +\d", line)]
    assert [(int(r[1]), int(r[2])) for r in forward_rows] == [(b, t) for b in (1, 4, 8, 16) for t in (64, 128)]
    e2e_rows = [line.split() for line in lines if re.match(r"e2e +\d", line)]
    assert [int(r[1]) for r in e2e_rows] == [1, 8]
    assert all(int(r[2]) == 64 for r in e2e_rows)  # gen 64 at one token per forward: 64 forwards
    assert sum(line.strip().startswith(("forward at", "outside the forward", "concurrency 8")) for line in lines) == 3

    report = json.loads(out.read_text())
    assert report["smoke_check_only"] is True and report["family"] == family
    assert len(report["forward"]) == 8 and len(report["end_to_end"]) == 2
    assert report["attention_kernels"] == {"unpadded": "flash", "padded": "flash"}  # CPU's flash takes masks
    for row in report["end_to_end"]:
        assert row["forwards"] == 64
        assert 0 <= row["forward_s"] <= row["step_s"] <= row["wall_s"]
        assert row["outside_forward_share"] == pytest.approx(row["sampler_share"] + row["scheduler_share"])
    # Fast-dLLM's cache on both families, the same requests: still one token per forward.
    cache_rows = report["kv_cache"]
    assert [(r["kv_cache"], r["concurrency"]) for r in cache_rows] == [
        (mode, c) for c in (1, 8) for mode in ("none", "prefix", "dual")
    ]
    assert all(r["forwards"] == 64 for r in cache_rows)


@pytest.mark.slow  # the script, in a subprocess
def test_gpu_benchmark_tiny_llada2_runs_the_cached_block_step(tmp_path):
    out = tmp_path / "gpu-llada2.json"
    done = run_gpu_script("--tiny", "--family", "llada2", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("SMOKE CHECK") for line in lines)
    assert any(line.startswith("matmul rate:") for line in lines)
    rows = [line.split() for line in lines if re.match(r"llada2 +\d", line)]
    assert [(int(r[1]), int(r[2])) for r in rows] == [(b, p) for p in (32, 64) for b in (1, 8)]
    assert sum(line.startswith("prompt ") and "batch 8 vs 1" in line for line in lines) == 2

    report = json.loads(out.read_text())
    assert report["smoke_check_only"] is True and report["family"] == "llada2"
    assert report["config"]["num_experts"] == 8  # the tiny plan, not LLaDA2-mini's 256
    for row in report["block_step"]:
        assert 0 < row["fastest_step_ms"] <= row["step_ms"]
        assert row["step_ms_per_request"] == pytest.approx(row["step_ms"] / row["batch"])
        assert row["vs_official"] == pytest.approx(row["batch"] * row["official_step_ms"] / row["step_ms"])
        # The block cache of one request: 3 layers × keys and values × 2 heads × 16 dims × fp32 × its canvas.
        canvas = row["prompt"] + 64
        assert row["kv_cache_mib_per_request"] == pytest.approx(3 * 2 * 2 * 16 * 4 * canvas / 2**20)


def test_llada2_mini_shapes_and_parameter_counts():
    """LLaDA2-mini is "16 B total, 1.4 B active": the benchmark's config must have its real shapes."""
    from benchmarks.llada2_shapes import LLADA2_MINI, parameter_counts

    d, layers, vocab = 2048, 20, 157184
    attention = d * (16 + 2 * 4) * 128 + 16 * 128 * d + 2 * 128  # fused qkv, output, q/k norms
    expert = 3 * d * 512
    moe_layer = attention + 256 * expert + 256 * d + expert + 2 * d  # experts, router, shared expert, 2 norms
    dense_layer = attention + 3 * d * 5120 + 2 * d
    total = 2 * vocab * d + dense_layer + (layers - 1) * moe_layer + d  # untied embeddings and head, final norm
    assert parameter_counts(LLADA2_MINI) == (total, total - (layers - 1) * (256 - 8) * expert)
    assert total == pytest.approx(16.26e9, rel=1e-3)
    assert total - (layers - 1) * 248 * expert == pytest.approx(1.43e9, rel=1e-2)


@pytest.mark.slow  # the script, in a subprocess
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_gpu_benchmark_quantize_flag_quantizes_the_blocks_and_reports_it(tmp_path, mode):
    pytest.importorskip("torchao", reason="--quantize needs the quant extra")
    out = tmp_path / "gpu.json"
    done = run_gpu_script("--tiny", "--quantize", mode, "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"quantize: {mode}" in done.stdout
    assert f"(14 of 14 layers quantized: {mode})" in done.stdout  # 2 blocks x 7 linear layers
    report = json.loads(out.read_text())
    assert report["quantize"] == mode and report["dtype"] == "bfloat16"  # a quantized model runs in bf16
    assert report["quantized_layers"] == 14
    assert report["block_weight_ratio_to_bf16"] <= {"int8": 0.55, "int4": 0.35}[mode]
    assert len(report["forward"]) == 8 and len(report["end_to_end"]) == 2


@pytest.mark.parametrize(
    ("flag", "message"), [("int3", "invalid choice: 'int3'"), ("fp8", "--quantize=fp8 needs a CUDA GPU")]
)
def test_gpu_benchmark_refuses_a_bad_quantize_value(flag, message):
    done = run_gpu_script("--tiny", "--quantize", flag)
    assert done.returncode != 0 and message in done.stderr


def test_flop_formula_at_llada_8b_scale():
    from benchmarks.gpu import LLADA_8B, block_weight_count, forward_flops

    with torch.device("meta"):
        model = LLaDAModelLM(LLADA_8B)
    p_blocks = block_weight_count(model)
    assert p_blocks == 32 * (4 * 4096**2 + 3 * 4096 * 12288)  # 6.98 B
    assert model.num_parameters() == pytest.approx(8.02e9, rel=0.01)  # LLaDA-8B
    flops = forward_flops(LLADA_8B, p_blocks, batch=8, canvas=512, candidates=8 * 32)
    block = 4 * 4096**2 + 3 * 4096 * 12288
    # 31 full blocks; the last computes keys and values at all 4096 positions, everything else at 256.
    linear = 2 * block * 8 * 512 * 31 + 2 * (2 * 4096**2) * 8 * 512 + 2 * (block - 2 * 4096**2) * 256
    attention = 4 * 31 * 4096 * 512**2 * 8 + 4 * 4096 * 512 * 256
    head = 2 * 4096 * 126464 * 256
    assert flops == linear + attention + head


def test_flop_formula_at_dream_7b_scale():
    from benchmarks.gpu import DREAM_7B, block_weight_count, forward_flops

    with torch.device("meta"):
        model = DreamModelLM(DREAM_7B)
    block = 2 * 3584**2 + 2 * 3584 * 512 + 3 * 3584 * 18944  # q, o; k, v (4 kv heads of 128); the MLP
    assert block_weight_count(model) == 28 * block  # 6.53 B: biases and norm scales are not counted
    assert model.num_parameters() == pytest.approx(7.62e9, rel=0.01)  # Dream-7B (Qwen2.5-7B's shapes)
    flops = forward_flops(DREAM_7B, 28 * block, batch=8, canvas=512, candidates=8 * 32)
    key_value = 2 * 3584 * 512
    linear = 2 * block * 8 * 512 * 27 + 2 * key_value * 8 * 512 + 2 * (block - key_value) * 256
    attention = 4 * 27 * 3584 * 512**2 * 8 + 4 * 3584 * 512 * 256
    head = 2 * 3584 * 152064 * 256
    assert flops == linear + attention + head


# --- loading: a bf16 checkpoint goes to the device as bf16, never through fp32 --------------------------


class TensorLog(TorchDispatchMode):
    """Every tensor any torch op produces while active: (op, dtype, device type)."""

    def __init__(self):
        super().__init__()
        self.outputs: list[tuple[str, torch.dtype, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.outputs += [(str(func), t.dtype, t.device.type) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_bf16_sharded_checkpoint_loads_without_any_fp32_tensor(tmp_path):
    shutil.copy(FIXTURE_DIR / "config.json", tmp_path / "config.json")
    state = load_file(FIXTURE_DIR / "model.safetensors")
    names = sorted(state)
    weight_map = {}
    for i, shard_names in enumerate((names[::2], names[1::2])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: state[n].to(torch.bfloat16) for n in shard_names}, tmp_path / shard)
        weight_map.update(dict.fromkeys(shard_names, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    with TensorLog() as log:
        model = load_model(tmp_path, "cpu", torch.bfloat16)
    real = [(op, dtype, device) for op, dtype, device in log.outputs if device != "meta"]  # meta: shapes only
    assert real, "the log saw the checkpoint's tensors being created"
    assert {device for _, _, device in real} == {"cpu"}  # created on the target device directly
    assert not [entry for entry in real if entry[1] == torch.float32], "an fp32 copy of a weight was made"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}

    # The check can see a widening: the same load in fp32 casts every tensor.
    with TensorLog() as log:
        load_model(tmp_path, "cpu", torch.float32)
    assert sum(op == "aten._to_copy.default" and dtype == torch.float32 for op, dtype, _ in log.outputs) == len(names)


# --- no hidden host-device synchronisation inside a step -------------------------------------------------

STEP_SETTINGS = [
    dict(gen_length=32, num_denoising_steps=32),
    dict(gen_length=16, num_denoising_steps=4, temperature=0.8, seed=1),  # Gumbel noise, several per step
    dict(gen_length=32, block_length=8, num_denoising_steps=8, confidence_metric="entropy_inverse"),
    dict(gen_length=16, num_denoising_steps=16, use_local_leap=True),
    dict(gen_length=8, num_denoising_steps=1, block_schedule="cosine"),  # a block's last step commits all
    dict(gen_length=16, num_denoising_steps=8, block_schedule="dream", confidence_metric="margin"),
]


@pytest.mark.parametrize("engine_fixture", ["fixture_engine", "dream_engine"], ids=["llada", "dream"])
def test_device_side_of_a_step_never_waits_for_the_device(engine_fixture, request):
    """Run the model and every request's proposal on the meta device, which has no data: any op that
    needs device values on the host (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`, `nonzero`, boolean
    indexing) raises there. The only such op in a step must be the one packed copy of the proposals."""
    engine = request.getfixturevalue(engine_fixture)
    with torch.device("meta"):
        model = MODEL_CLASSES[type(engine.model.config)](engine.model.config)
    meta = torch.device("meta")
    requests = [
        engine.new_request(prompt_token_ids=list(range(5, 5 + 3 * i + 2)), params=SamplingParams(**settings))
        for i, settings in enumerate(STEP_SETTINGS)
    ]  # prompts of different lengths: the batch is padded, so the masked forward runs too

    for request in requests:  # each request's device-side step, alone
        offsets = request.candidate_offsets()
        logits = torch.empty(len(offsets), model.config.vocab_size, device=meta)
        assert request.propose(logits, torch.tensor(offsets, device=meta)).device == meta

    # The whole batched step: staging, the one host-to-device copy, the padded forward, every proposal;
    # the first op that needs data must be the packed device-to-host copy at the end.
    with pytest.raises(NotImplementedError, match="meta") as caught:
        denoise_step(model, requests, meta, engine.model.config.pad_token_id)
    assert "packed = " in str(caught.traceback[-1].statement)


CACHED_SETTINGS = [
    dict(gen_length=32, block_length=8, num_denoising_steps=16, kv_cache="dual"),
    dict(gen_length=32, block_length=16, kv_cache="prefix", confidence_threshold=0.9),
    dict(gen_length=16, block_length=8, kv_cache="dual", confidence_threshold=0.5, temperature=0.7, seed=3),
    dict(gen_length=16, num_denoising_steps=16),  # an uncached row in the same frame
]


@pytest.mark.parametrize("engine_fixture", ["fixture_engine", "dream_engine"])
@pytest.mark.parametrize(
    "mid_block", [(False, True, True, False), (True,), (False,)], ids=["mixed", "lone-cached", "lone-first-forward"]
)
def test_device_side_of_a_cached_step_never_waits_for_the_device(request, engine_fixture, mid_block):
    """The KV-cache path (KVFrame forward over the KV pool, filler columns, the threshold rule) on the meta
    device, for both families that have it: as above, the only op that may read device data is the packed
    copy of the proposals."""
    engine = request.getfixturevalue(engine_fixture)
    with torch.device("meta"):
        model = type(engine.model)(engine.model.config)
    meta = torch.device("meta")
    requests = []
    for i, (settings, cached) in enumerate(zip(CACHED_SETTINGS, mid_block)):
        new = engine.new_request(prompt_token_ids=list(range(5, 5 + 3 * i + 2)), params=SamplingParams(**settings))
        if cached:  # as if the block's first forward had run: the next one reads the cache (its pool row)
            new.block_step = 1
            kv_slots(model).acquire(new)
        requests.append(new)
    assert any(r.forward_span() != (0, r.length) for r in requests) == any(mid_block)
    with pytest.raises(NotImplementedError, match="meta") as caught:
        denoise_step(model, requests, meta, engine.model.config.pad_token_id)
    assert "packed = " in str(caught.traceback[-1].statement)


def test_bf16_padded_batch_runs_the_boolean_key_mask_and_matches_fp32():
    """The padded path passes SDPA a boolean key mask with bf16 inputs; its row must agree with the fp32
    model on the unpadded prompt (up to bf16 rounding, far below what attending to the pads would cost)."""
    model = load_model(FIXTURE_DIR, "cpu", torch.bfloat16)
    short, long = list(range(3, 15)), list(range(20, 40))
    pad = len(long) - len(short)
    ids = torch.tensor([[model.config.pad_token_id] * pad + short, long])
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    with torch.inference_mode():
        batched = model(ids, mask)
        reference = load_model(FIXTURE_DIR, "cpu", torch.float32)(torch.tensor([short]))[0]
    assert batched.dtype == torch.bfloat16
    row = batched[0, pad:].float()
    # Measured: mean |error| 0.09 with the mask, 1.1 if the pads were attended to (logits up to ~19).
    assert (row - reference).abs().mean() < 0.3
    assert torch.equal(row.argmax(-1), reference.argmax(-1))


# --- torch.compile: opt-in, wired through load_model, from_pretrained and DLLM_COMPILE ------------------


def is_compiled(model: LLaDAModelLM) -> bool:
    return static_shapes_of(model) is not None


def test_compile_is_off_by_default_and_opt_in(monkeypatch):
    monkeypatch.delenv("DLLM_COMPILE", raising=False)
    assert not is_compiled(load_model(FIXTURE_DIR, "cpu"))
    assert is_compiled(load_model(FIXTURE_DIR, "cpu", compile=True))  # compiles lazily: no forward run
    monkeypatch.setenv("DLLM_COMPILE", "1")
    assert is_compiled(DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu").model)
    assert not is_compiled(load_model(FIXTURE_DIR, "cpu", compile=False))  # the argument wins
    monkeypatch.setenv("DLLM_COMPILE", "yes please")
    with pytest.raises(ValueError, match="DLLM_COMPILE"):
        compile_from_env()


def test_compiled_model_keeps_its_state_dict_names():
    model = load_model(FIXTURE_DIR, "cpu", compile=True)
    assert set(model.state_dict()) == set(load_file(FIXTURE_DIR / "model.safetensors"))
    assert isinstance(model.config, LLaDAConfig)
