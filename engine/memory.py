"""How much work the scheduler takes on, by default, for its device: the memory the requests' KV caches may
hold together, the longest prompt, and the positions one forward computes.

A cached request keeps its canvas's keys and values from each block's first forward to the end of the block:
n_layers × 2 × n_kv_heads × head_dim × (prompt + canvas) elements — for LLaDA-8B in bfloat16, 32 × 2 × 4096 ×
2 bytes = 0.5 MiB per position, 160 MiB for a 64-token prompt and a 256-token canvas (LLaDA2's exact block cache
is sized the same way on its block-rounded canvas, and kept for the request's whole life). The caches live in one
preallocated pool (engine/kv_slots.py) whose rows are as wide as the longest live canvas (rounded up to 64
columns, plus one) and whose row count is rounded up to a power of two, so the pool can hold more than the
sum of the reservations: the defaults leave that headroom. No step copies a cache.
"""

from __future__ import annotations

import os

import torch

# Shares of the memory that is free once the model is loaded (CUDA) or of the machine's memory (CPU). On
# CUDA the rest is the pool's rounding above, activations and the allocator's slack.
CUDA_FREE_MEMORY_SHARE = 0.4
CPU_MEMORY_SHARE = 0.25


def default_kv_cache_budget(device: torch.device) -> int:
    """Bytes of KV cache that running requests may hold together, by default, on `device`."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * CUDA_FREE_MEMORY_SHARE)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * CPU_MEMORY_SHARE)


# A step's time grows with its length (attention with its square): these keep one step of the longest prompt
# within about a second for the models this engine serves on each kind of device, measured on the 2-core CPU
# host with the test checkpoints and sized for an 8B model on one data-centre GPU.
CPU_MAX_PROMPT_TOKENS = 8192
CUDA_MAX_PROMPT_TOKENS = 32768
CPU_STEP_TOKEN_BUDGET = 8192
CUDA_STEP_TOKEN_BUDGET = 65536


def default_max_prompt_tokens(device: torch.device) -> int:
    """The longest prompt served by default on `device` (the model's own maximum may be lower)."""
    return CUDA_MAX_PROMPT_TOKENS if device.type == "cuda" else CPU_MAX_PROMPT_TOKENS


def default_step_token_budget(device: torch.device) -> int:
    """The most positions a shared forward computes by default on `device`."""
    return CUDA_STEP_TOKEN_BUDGET if device.type == "cuda" else CPU_STEP_TOKEN_BUDGET


def mebibytes(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
