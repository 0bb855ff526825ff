"""Weight-only quantization of the transformer blocks' linear layers at load time, through torchao.

`DLLM_QUANTIZE` / `quantize=`: none (default), int8, int4 or fp8. What is quantized is chosen by structure,
not by name: every `nn.Linear` inside a transformer block (attention, MLP, and the experts of a mixture-of-
experts family), so a family added later is covered without edits here. The embedding, the norms and the
LM head stay in the model dtype: they sit outside the blocks (or are not linear layers), the LM head is
read at the candidate positions only, and the embedding is a lookup, not a matmul. The one exception
inside a block is a mixture-of-experts router (a linear named `gate` or `router`): it is a few rows
whose top-k choice flips on small errors, so it is left as it is.

Streaming: `BlockStreamer` takes the checkpoint's tensors one by one as `engine.loading.load_model` reads
them; as soon as every tensor of a block has arrived, the block is materialised and quantized, and its
full-precision tensors are dropped. Peak memory is then the quantized model plus one block in the model
dtype plus what lies outside the blocks, not the whole model in full precision.

The torchao configuration per mode and device (torchao's own recommendations for each):
- int8: `Int8WeightOnlyConfig`, one scale per output row. On any device.
- int4: groups of 128 input columns (64 or 32 where 128 does not divide the layer's width), asymmetric.
  CPU: the "opaque" layout for `aten._weight_int4pack_mm_for_cpu` (torchao's prototype CPU workflow).
  CUDA: the tile-packed layout for the tinygemm kernel (`aten._weight_int4pack_mm`), with HQQ's choice
  of scales. int4 needs dtype bfloat16 on both (see `check_quantization`).
A quantized model loads in bfloat16 unless another dtype is asked for (`quantized_dtype`).
- fp8: `Float8WeightOnlyConfig` (e4m3, one scale per row), on CUDA GPUs of compute capability 8.9 or
  newer (Ada, Hopper, Blackwell). Elsewhere it is refused at startup.
torchao is an optional dependency (`pip install 'dllm-serve[quant]'`), imported only when a mode other than
none is asked for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger("dllm_serve.engine.quantization")

QUANTIZE_MODES = ("none", "int8", "int4", "fp8")
# int4 group sizes torchao's kernels accept, preferred first (128 is torchao's default and the usual
# choice for 7-8B models; smaller groups cost more scale bytes).
INT4_GROUP_SIZES = (128, 64, 32)
# Linear layers inside a block that stay unquantized: mixture-of-experts routers (see the module docstring).
ROUTER_NAMES = frozenset({"gate", "router"})
# The attribute `BlockStreamer` sets on the model it quantized (read by `loaded_quantization`).
_MODEL_ATTRIBUTE = "dllm_quantization"
FP8_MIN_CAPABILITY = (8, 9)


def quantize_mode(value: str | None, setting: str = "quantize") -> str:
    """A mode's name (from `quantize=` or DLLM_QUANTIZE) → one of QUANTIZE_MODES; ValueError naming `setting`."""
    if value is None:
        return "none"
    if not isinstance(value, str):
        raise ValueError(f"{setting} must be one of {', '.join(QUANTIZE_MODES)}, got {value!r}")
    mode = value.strip().lower() or "none"
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"{setting} must be one of {', '.join(QUANTIZE_MODES)}, got {value!r}")
    return mode


def quantize_from_env() -> str:
    """DLLM_QUANTIZE: none (default), int8, int4 or fp8."""
    return quantize_mode(os.environ.get("DLLM_QUANTIZE"), "DLLM_QUANTIZE")


def check_quantization(
    mode: str, device: str | torch.device, dtype: torch.dtype | None, setting: str = "quantize"
) -> None:
    """Refuse (ValueError naming `setting`) a mode this device, dtype or installation cannot run.

    Cheap: no weights are touched, so the server's startup check can call it before any worker starts.
    """
    if mode == "none":
        return
    device = torch.device(device)
    if mode == "fp8":
        on_cuda = device.type == "cuda" and torch.cuda.is_available()
        capability = torch.cuda.get_device_capability(device) if on_cuda else None
        if capability is None or capability < FP8_MIN_CAPABILITY:
            where = f"compute capability {capability[0]}.{capability[1]}" if capability else f"device {device.type}"
            raise ValueError(
                f"{setting}=fp8 needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                f"this is {where}. Use int8 or int4 here."
            )
    if mode == "int4" and dtype not in (None, torch.bfloat16):
        # CUDA's tinygemm kernel takes bfloat16 only; the CPU one takes float32 too, but was 40x slower with
        # it than with bfloat16 in benchmarks/quantization.py (seconds per forward of the embedded model).
        raise ValueError(f"{setting}=int4 needs dtype bfloat16 (its kernels' activation dtype), got {dtype}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{setting}={mode} is supported on cpu and cuda, not on {device.type}")
    _import_torchao(setting, mode)


def quantized_dtype(mode: str, dtype: torch.dtype | None) -> torch.dtype | None:
    """The model dtype when none was asked for: bfloat16 for quantized weights on every device (the int4
    kernels need it, and on the CPU too the quantized layers' activations run in it); None leaves the
    device's own default (engine.loading.default_dtype)."""
    return dtype if dtype is not None or mode == "none" else torch.bfloat16


def _import_torchao(setting: str, mode: str):
    try:
        # torchao logs a warning for each of its CUDA-only extensions a CPU build of torch cannot load;
        # they are not used on the CPU, and the warnings would read as a failure in the startup log.
        ao_logger = logging.getLogger("torchao")
        level = ao_logger.level
        ao_logger.setLevel(logging.ERROR)
        try:
            import torchao
        finally:
            ao_logger.setLevel(level)
    except ImportError:
        raise ValueError(
            f"{setting}={mode} needs torchao, which is not installed: pip install 'dllm-serve[quant]'"
        ) from None
    return torchao


def torchao_config(mode: str, device: torch.device, in_features: int):
    """The torchao config that quantizes one linear layer of width `in_features`; None → leave it as it is."""
    if mode == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        return Int8WeightOnlyConfig(set_inductor_config=False)
    if mode == "fp8":
        from torchao.quantization import Float8WeightOnlyConfig

        return Float8WeightOnlyConfig(set_inductor_config=False)
    if mode == "int4":
        group_size = next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)
        if group_size is None:
            return None
        if device.type == "cuda":
            from torchao.quantization import Int4WeightOnlyConfig

            return Int4WeightOnlyConfig(
                group_size=group_size,
                int4_packing_format="tile_packed_to_4d",
                int4_choose_qparams_algorithm="hqq",
                set_inductor_config=False,
            )
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)
    raise ValueError(f"no torchao config for quantization {mode!r}")


def block_linears(block: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """The linear layers of one transformer block that quantization replaces (routers excepted)."""
    for name, module in block.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] not in ROUTER_NAMES:
            yield name, module


def quantize_block(block: nn.Module, mode: str) -> int:
    """Quantize the block's linear layers in place; returns how many were quantized."""
    from torchao.quantization import quantize_

    quantized = 0
    for _name, linear in list(block_linears(block)):
        config = torchao_config(mode, linear.weight.device, linear.in_features)
        if config is None:
            continue  # no int4 group size divides this width: kept in the model dtype
        quantize_(linear, config)
        quantized += 1
        if linear.weight.device.type == "cpu":
            release_freed_host_memory()  # before the next layer's temporaries, not after the block's
    return quantized


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds; a torchao tensor subclass counts its packed data, scales and zero points."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _context = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class WeightBytes:
    """The weights of the layers quantization targets, as loaded and as they would be in bfloat16."""

    layers: int  # linear layers in the blocks that quantization targets
    quantized_layers: int  # of those, the ones holding a quantized weight
    loaded_bytes: int  # their weights as they are now
    unquantized_bytes: int  # the same weights in the model dtype (what loading without quantization holds)
    bf16_bytes: int  # the same weights in bfloat16 (2 bytes an element)
    model_bytes: int  # every parameter and buffer of the model as loaded

    @property
    def ratio_to_bf16(self) -> float:
        return self.loaded_bytes / self.bf16_bytes if self.bf16_bytes else 1.0


def weight_bytes(model: nn.Module, blocks: nn.ModuleList) -> WeightBytes:
    """Byte accounting of `blocks`' target linear layers and of the whole model."""
    layers = quantized = loaded = unquantized = bf16 = 0
    for block in blocks:
        for _name, linear in block_linears(block):
            weight = linear.weight
            layers += 1
            quantized += hasattr(weight, "__tensor_flatten__")
            loaded += tensor_bytes(weight)
            unquantized += weight.numel() * weight.dtype.itemsize  # a torchao weight keeps its original dtype
            bf16 += weight.numel() * 2
    return WeightBytes(layers, quantized, loaded, unquantized, bf16, model_weight_bytes(model))


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of the model, quantized ones at their packed size."""
    return sum(tensor_bytes(t) for t in (*model.parameters(), *model.buffers()))


def _glibc_malloc_trim():
    """glibc's malloc_trim, or None on another C library."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc_malloc_trim()


def release_freed_host_memory() -> None:
    """Hand memory that was freed back to the OS. Quantizing a layer allocates temporaries (its weight in
    float32, the rounded values, int4's int32 staging) that glibc keeps after they are freed and, with
    layers of varying sizes, does not reuse well. Trimming after each layer lowered the peak of loading a
    260 MiB bf16 checkpoint (benchmarks/quantization.py) from 2.3x to 1.3x the int8 result, and from
    2.8x to 1.2-1.6x the int4 one; without any trimming the process grew past the bf16 checkpoint itself."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _copy_off_the_mapping(block: nn.Module) -> None:
    """Replace the block's unquantized tensors (norm scales, biases, layers left as they were) by copies, so
    that none of them keeps the checkpoint's memory mapping alive (see `BlockStreamer.take`)."""
    for tensor in (*block.parameters(), *block.buffers()):
        if not hasattr(tensor, "__tensor_flatten__"):
            tensor.data = tensor.data.clone()


def loaded_quantization(model: nn.Module) -> str:
    """Which quantization the model was loaded with ("none" for an unquantized one)."""
    return getattr(model, _MODEL_ATTRIBUTE, "none")


class BlockStreamer:
    """Materialises and quantizes each transformer block as soon as the loader has read all its tensors.

    `take(name, tensor)` is called for every tensor the loader reads; it keeps the tensors of the blocks
    and hands back the others for the loader's own state dict. With mode none it takes nothing, so
    unquantized loading is exactly what it was.
    """

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, mode: str):
        self.model, self.blocks, self.mode = model, blocks, mode
        prefix = next(name for name, module in model.named_modules() if module is blocks)
        self._prefix = f"{prefix}."
        names = model.state_dict().keys()
        self._wanted: dict[int, set[str]] = {}  # block index → its tensor names (relative to the block)
        for name in names:
            if name.startswith(self._prefix):
                index, rest = name[len(self._prefix) :].split(".", 1)
                self._wanted.setdefault(int(index), set()).add(rest)
        self._pending: dict[int, dict[str, torch.Tensor]] = {}
        self.taken: set[str] = set()  # full names of the tensors taken (for the loader's completeness check)
        self.quantized_layers = 0

    def take(self, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """None when the streamer took the tensor (a block's); otherwise the tensor for the loader to keep.

        On the CPU safetensors hands out views of the memory-mapped file, and one view kept (the embedding,
        say) keeps the whole mapping, every page read for quantization included, in the process's resident
        memory. So when quantizing, the tensors handed back are copies: the mapping goes when the file closes.
        """
        if self.mode == "none":
            return tensor
        if not name.startswith(self._prefix):
            return tensor.clone() if tensor.device.type == "cpu" else tensor
        index_text, rest = name[len(self._prefix) :].split(".", 1)
        index = int(index_text)
        pending = self._pending.setdefault(index, {})
        pending[rest] = tensor
        self.taken.add(name)
        if pending.keys() == self._wanted[index]:
            block = self.blocks[index]
            block.load_state_dict(self._pending.pop(index), assign=True)
            block.eval().requires_grad_(False)
            self.quantized_layers += quantize_block(block, self.mode)
            if tensor.device.type == "cpu":
                _copy_off_the_mapping(block)
        return None

    def finish(self) -> None:
        """Mark the model as quantized and log its weight bytes before and after (the loader checked that
        every tensor arrived, so no block is left pending)."""
        if self.mode == "none":
            return
        setattr(self.model, _MODEL_ATTRIBUTE, self.mode)
        summary = weight_bytes(self.model, self.blocks)
        logger.info(
            "quantized %d of %d linear layers in the blocks to %s: their weights %.1f MiB → %.1f MiB "
            "(%.0f%% of their %.1f MiB in bf16); whole model now %.1f MiB",
            summary.quantized_layers,
            summary.layers,
            self.mode,
            summary.unquantized_bytes / 2**20,
            summary.loaded_bytes / 2**20,
            100 * summary.ratio_to_bf16,
            summary.bf16_bytes / 2**20,
            summary.model_bytes / 2**20,
        )
