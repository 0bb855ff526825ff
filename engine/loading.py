"""Find a checkpoint (local directory or hub id), tell its family from config.json, load its weights onto a device."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open

from engine.compiled import compile_static
from engine.config import DreamConfig, LLaDA2Config, LLaDAConfig, read_config
from engine.dream import DreamModelLM
from engine.llada2 import LLaDA2MoeModelLM
from engine.model import LLaDAModelLM
from engine.quantization import BlockStreamer, check_quantization, quantize_from_env, quantize_mode, quantized_dtype

logger = logging.getLogger(__name__)

DiffusionLM = LLaDAModelLM | DreamModelLM | LLaDA2MoeModelLM
# One model class per family; each takes its config and has the forward contract engine/batch.py uses.
MODEL_CLASSES = {LLaDAConfig: LLaDAModelLM, DreamConfig: DreamModelLM, LLaDA2Config: LLaDA2MoeModelLM}

# The embedded default model, trained by scripts/train_tiny_model.py.
EMBEDDED_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-llada-chat"

# merges.txt: Dream's checkpoints ship their tokenizer as vocab.json + merges.txt, without tokenizer.json.
_CHECKPOINT_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "merges.txt"]


def local_model_dir(path_or_hub_id: str | Path | None) -> Path | None:
    """The local directory named (the embedded model for None); None for a hub id; FileNotFoundError for a
    path that does not exist."""
    if path_or_hub_id is None:
        return EMBEDDED_MODEL_DIR
    local = Path(path_or_hub_id).expanduser()
    if local.is_dir():
        return local
    if local.is_absolute() or str(path_or_hub_id).startswith((".", "~")) or str(path_or_hub_id).count("/") != 1:
        raise FileNotFoundError(f"model directory {path_or_hub_id!r} does not exist (and is not a hub id 'org/name')")
    return None


def resolve_model_dir(path_or_hub_id: str | Path | None) -> Path:
    """A local directory as is; anything else is a hub id fetched (or found in the cache) by huggingface_hub."""
    local = local_model_dir(path_or_hub_id)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=str(path_or_hub_id), allow_patterns=_CHECKPOINT_FILES))


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


# The weight dtypes the model runs in (its norms and RoPE upcast to float32 internally).
SUPPORTED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def dtype_from_name(name: str) -> torch.dtype:
    """A dtype's name (DLLM_DTYPE, --dtype) → the torch dtype; names outside SUPPORTED_DTYPES are refused."""
    try:
        return SUPPORTED_DTYPES[name.strip().lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {name!r}") from None


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in shards]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")


def compile_from_env() -> bool:
    """DLLM_COMPILE=1 turns on the compiled static-shape forward (engine/compiled.py); off by default (on
    this project's CPU measurements eager is as fast: docs/benchmarks.md)."""
    raw = os.environ.get("DLLM_COMPILE", "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"DLLM_COMPILE must be 1 or 0, got {raw!r}")


def check_compile(compile: bool, quantize: str, setting: str = "compile") -> None:
    """Compiling quantized weights is refused: torchao's weight tensors make dynamo recompile the forward at
    every step until its recompile limit (measured on CPU), which is slower than eager, not faster."""
    if compile and quantize != "none":
        raise ValueError(
            f"{setting}: the compiled forward does not apply to quantized weights (quantize={quantize!r}); "
            "use one or the other"
        )


def transformer_blocks(model: DiffusionLM) -> torch.nn.ModuleList:
    """The repeated layers of any family (where all the compute is)."""
    if isinstance(model, (DreamModelLM, LLaDA2MoeModelLM)):
        return model.model.layers
    return model.model.transformer.blocks


def compile_model(model: DiffusionLM) -> DiffusionLM:
    """Give the model its compiled static-shape forward (engine/compiled.py), used by engine/batch.py's steps;
    module, state dict and `model.config` unchanged. LLaDA2's block step is not compiled (it stays eager)."""
    if isinstance(model, LLaDA2MoeModelLM):
        logger.warning("compile: LLaDA2's block step has no compiled forward yet; it runs eagerly")
        return model
    compile_static(model)
    return model


def load_model(
    model_dir: Path,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    compile: bool | None = None,
    quantize: str | None = None,
) -> DiffusionLM:
    """Build the model on the meta device, then read each tensor straight onto `device` in `dtype`.

    No full-precision copy of the weights is ever held in host memory: safetensors reads each tensor
    onto the target device and it is cast there, one tensor at a time (a bf16 checkpoint loaded in bf16
    is never cast at all).
    The family (LLaDA, Dream or LLaDA2) comes from config.json (`engine.config.read_config`); its own tensor names
    must match exactly, so a checkpoint of another architecture fails here rather than computing garbage.
    compile: the compiled static-shape forward (`compile_model`); None → DLLM_COMPILE (off unless 1). Refused
        with quantized weights.
    quantize: none, int8, int4 or fp8 (engine/quantization.py): each block's linear layers are quantized as
        soon as the block's tensors are read; None → DLLM_QUANTIZE (none unless set).
    """
    compile = compile_from_env() if compile is None else compile
    quantize = quantize_from_env() if quantize is None else quantize_mode(quantize)
    check_compile(compile, quantize)
    config = read_config(model_dir)
    dtype = quantized_dtype(quantize, dtype) or default_dtype(device)
    check_quantization(quantize, device, dtype)
    with torch.device("meta"):
        model = MODEL_CLASSES[type(config)](config)
    expected = set(model.state_dict())
    streamer = BlockStreamer(model, transformer_blocks(model), quantize)
    state: dict[str, torch.Tensor] = {}
    target = str(torch.device(device))
    for file in weight_files(model_dir):
        with safe_open(str(file), framework="pt", device=target) as shard:
            for name in shard.keys():
                if name not in expected:
                    raise ValueError(f"unexpected tensor {name!r} in {file.name}: not a {config.family} checkpoint?")
                kept = streamer.take(name, shard.get_tensor(name).to(dtype))  # None: quantized with its block
                if kept is not None:
                    state[name] = kept
    missing = expected - set(state) - streamer.taken
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks {len(missing)} tensors, e.g. {sorted(missing)[0]!r}")
    model.load_state_dict(state, assign=True, strict=not streamer.taken)  # the streamer loaded the rest
    model.eval().requires_grad_(False)
    streamer.finish()
    return compile_model(model) if compile else model
