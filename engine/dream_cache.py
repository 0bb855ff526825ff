"""Fast-dLLM's approximate KV cache on the Dream family: the sampler's side (docs/sampler.md, "KV cache on Dream").

The forwards are the LLaDA family's (engine/batch.py, one `KVFrame` implementation for both): a block's first
forward runs the whole canvas and leaves the request its keys and values; the block's later forwards compute
only [s, T) ("prefix") or [s, e) ("dual"). What differs is which positions each forward may decide, because
Dream's logits are shifted: the token at position j is predicted by the hidden state at j − 1.

A cached forward starts at the block's first position s, so nothing it computes predicts s (that needs row s − 1,
which only the cache holds). Fast-dLLM's Dream sampler (`dream/model/generation_utils_block.py`, see
tests/fixtures/fast-dllm-dream/README.md) therefore decides s at the block's full forward, and only s:

- the full forward commits exactly position s, its most likely token, whatever the metric, the threshold or the
  confidence;
- the cached forwards fill (s, e): by the threshold rule (the most confident always, every other ≥ τ), or by
  the block schedule over the block's remaining S − 1 steps. Dream's own schedule ("dream") continues its time
  grid there: steps 1 … S − 1 of `linspace(1, eps, S + 1)`, from the block_length − 1 masks left, so the
  first cached forward of a one-step-per-token block commits nothing, as the official one does. The other
  schedules spread the block_length − 1 masks over the S − 1 cached forwards.
- with one step per block (S = 1) the official sampler still runs one cached forward, commits nothing in it and
  leaves the rest of the block masked. That is reproduced (the forward count and the canvas match): the result's
  `canvas_ids` keep the mask ids, and its text and token ids end at the first position never filled.

Each cached forward's logits at (s, e) come from rows [s, e − 1) of that forward, all of which it computes: the
candidates never reach outside the span (`forward_span`), so the batch code needs nothing family-specific.
"""

from __future__ import annotations

import torch

from engine.config import DREAM_TIMESTEP_EPS
from engine.sampler import DenoisingRequest
from engine.schedules import block_quotas, dream_quotas


def cached_block_quotas(schedule: str, block_length: int, steps: int, eps: float) -> list[int]:
    """Tokens each forward of a cached Dream block commits: 1 (position s, at the full forward), then the schedule
    over the other steps. One step per block: [1, 0], the official wasted forward."""
    if steps == 1:
        return [1, 0]
    left = block_length - 1
    if schedule == "dream":
        return [1, *dream_quotas(left, steps, eps, first_step=1)]
    return [1, *block_quotas(schedule, left, steps - 1)]


class DreamCachedRequest(DenoisingRequest):
    """A Dream request with `kv_cache` "prefix" or "dual": `DenoisingRequest` with Fast-dLLM's Dream block."""

    def __init__(self, *args, timestep_eps: float = DREAM_TIMESTEP_EPS, **kwargs):
        super().__init__(*args, timestep_eps=timestep_eps, **kwargs)
        p = self.params
        self.quota_mode = p.confidence_threshold is None
        if self.quota_mode:
            self.quotas = cached_block_quotas(p.block_schedule, p.block_length, p.steps_per_block, timestep_eps)

    def candidate_offsets(self) -> list[int]:
        """At a block's full forward, the block's first position alone; then its masked positions."""
        if self.block_step == 0:
            return [self.block * self.params.block_length]
        return super().candidate_offsets()

    def propose(self, logits: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if self._spent_forward():
            return torch.full((logits.shape[0],), -1, dtype=torch.long, device=logits.device)
        return super().propose(logits, offsets)

    def _spent_forward(self) -> bool:
        """The cached forward of a one-step block (quota mode): it runs, and commits nothing."""
        return self.quota_mode and self.block_step >= self.params.steps_per_block

    def _block_done(self) -> bool:
        # Quota mode: a block takes its schedule's forwards at most (one step per block: two, masks left).
        return super()._block_done() or (self.quota_mode and self.block_step >= len(self.quotas))
