"""The official LLaDA sampling loop, written plainly: the baseline the engine is measured against.

It does what ML-GSAI/LLaDA's `generate()` does at temperature 0 with low-confidence remasking: every step
runs the model over the whole canvas, takes logits and a float64 softmax at *every* position, masks out
everything that is not a candidate, and commits the top-k; no early exit, one request at a time. Used
only for comparison (never by the server).
"""

from __future__ import annotations

import torch

from engine.model import LLaDAModelLM
from engine.schedules import uniform_quotas


@torch.inference_mode()
def reference_generate(
    model: LLaDAModelLM,
    prompt_ids: list[int],
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    mask_id: int,
) -> tuple[list[int], int]:
    """The generated region (full canvas, untruncated) and the number of forward passes."""
    prompt_length = len(prompt_ids)
    canvas = torch.full((1, prompt_length + gen_length), mask_id, dtype=torch.long)
    canvas[0, :prompt_length] = torch.tensor(prompt_ids)
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    forwards = 0
    for block in range(num_blocks):
        block_end = prompt_length + (block + 1) * block_length
        quotas = uniform_quotas(block_length, steps_per_block)
        for quota in quotas:
            is_masked = canvas == mask_id
            logits = model(canvas)  # [1, T, V]: the LM head at every position
            forwards += 1
            prediction = logits.argmax(-1)
            probs = torch.softmax(logits.double(), dim=-1)
            confidence = probs.gather(-1, prediction[..., None]).squeeze(-1)
            confidence[:, block_end:] = -torch.inf
            confidence = torch.where(is_masked, confidence, -torch.inf)
            chosen = torch.topk(confidence[0], k=quota).indices
            canvas[0, chosen] = prediction[0, chosen]
    return canvas[0, prompt_length:].tolist(), forwards
