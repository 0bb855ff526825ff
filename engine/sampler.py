"""The per-request diffusion sampler (docs/design.md, "Sampler").

A `DenoisingRequest` holds one request's canvas and walks it block by block. A step is split in two so
that many requests can share one model forward (engine/batch.py):

- `propose(logits, positions)` runs on the model's device with no host synchronisation: prediction,
  confidence, quota and LocalLeap give, per candidate, the token to commit now or −1;
- `commit(offsets, proposal)` runs on the host once that small tensor has arrived (as a list): it updates
  the canvas, the streamed text and the finish state, and returns the step's `StepEvent`.

Only the current block's masked positions are candidates, and softmax, entropy and noise are computed
at those positions only (never over the whole canvas or vocabulary-wide for the prompt).

With `kv_cache` (Fast-dLLM's approximate cache), a block's first forward runs the whole canvas and leaves the
request its keys and values (`kv_cache_tensor`); the block's later forwards compute only `forward_span()`:
the block and everything after it ("prefix": the prompt and earlier blocks come from the cache) or the block
alone ("dual": everything else comes from the cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.config import DREAM_TIMESTEP_EPS
from engine.params import SamplingParams
from engine.schedules import block_quotas
from engine.text import IncrementalText


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # generated ids up to (excluding) the first EOS/EOT, or up to the stop-string cut
    canvas_ids: list[int]  # the whole generated region as sampled; positions never committed keep the mask id
    text: str
    finish_reason: str  # "stop" | "length"
    num_forward_passes: int
    prompt_tokens: int
    params: SamplingParams
    step_commits: list[list[int]] = field(repr=False)  # offsets committed by each forward pass
    # Offsets overwritten (token → token) by each forward pass: block diffusion with editing (LLaDA2.1) only.
    step_edits: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepEvent:
    step: int  # 0-based index of this request's forward pass
    block: int
    committed: list[tuple[int, int]]  # (offset from the first generated position, token id)
    text_delta: str  # text that became final with this step; the deltas concatenate to the final text
    masked_remaining: int
    finished: bool
    result: GenerationResult | None = None  # set on the last event only
    # (offset, new token) of positions already written that this step overwrote: LLaDA2.1's token editing
    # (engine/block_sampler.py); always empty for the other samplers. Edited text is streamed once its block closes.
    edited: list[tuple[int, int]] = field(default_factory=list)


def local_leap_mask(
    confidence: torch.Tensor, positions: torch.Tensor, anchor: float, neighbor: float, radius: int
) -> torch.Tensor:
    """LocalLeap (arXiv:2510.07081): anchors are candidates with c ≥ κ; a candidate within `radius`
    canvas positions of an anchor and with c ≥ τ is committed with it."""
    is_anchor = confidence >= anchor
    distance = (positions[:, None] - positions[None, :]).abs()
    near_anchor = ((distance <= radius) & is_anchor[None, :]).any(dim=1)
    return is_anchor | (near_anchor & (confidence >= neighbor))


def confidence_of(logits: torch.Tensor, prediction: torch.Tensor, metric: str) -> torch.Tensor:
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    if metric == "top1_prob":
        return log_probs.gather(-1, prediction[:, None]).squeeze(-1).exp()
    if metric == "margin":
        # Dream's `topk_margin`: how far the best token leads the runner-up, p1 − p2 (whatever was sampled).
        top2 = log_probs.topk(2, dim=-1).values.exp()
        return top2[:, 0] - top2[:, 1]
    # entropy_inverse: exp(−H) lies in (0, 1] and ranks positions as Dream's entropy rule does.
    return (log_probs.exp() * log_probs).sum(-1).exp()


class DenoisingRequest:
    """One request's canvas and progress. The host-side state is plain Python lists: a step touches a few
    positions, and list operations cost far less than launching torch ops on tiny tensors."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        mask_id: int,
        stop_ids: frozenset[int],
        decode: Callable[[list[int]], str],
        device: torch.device,
        kv_cache_bytes: int = 0,
        timestep_eps: float = DREAM_TIMESTEP_EPS,
    ):
        """timestep_eps: the "dream" schedule's end time, from the model's generation_config."""
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.mask_id = mask_id
        self.stop_ids = stop_ids
        self._decode = decode
        self.generated = [mask_id] * params.gen_length  # the canvas after the prompt
        self.masked = [True] * params.gen_length
        self.masked_count = params.gen_length
        self.block = 0
        self.block_step = 0
        self.quotas = block_quotas(params.block_schedule, params.block_length, params.steps_per_block, timestep_eps)
        self.step = 0
        self.first_masked = 0  # committed prefix = generated offsets [0, first_masked)
        self.stop_offset: int | None = None  # first EOS/EOT inside the committed prefix
        self.step_commits: list[list[int]] = []
        self.text = IncrementalText(decode, params.stop)
        self.finished = False
        self.result: GenerationResult | None = None
        self.generator = None
        if params.temperature > 0:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        # The row of the model's KV pool (engine/kv_slots.py) that holds this request's keys and values from its
        # first cached forward to its end; engine/batch.py takes it and writes it. None: no cache (yet).
        self.kv_slot = None
        self.kv_cache_bytes = kv_cache_bytes

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_ids)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + self.params.gen_length

    @property
    def uses_kv_cache(self) -> bool:
        return self.params.kv_cache != "none"

    def forward_span(self) -> tuple[int, int]:
        """The canvas positions [start, end) (prompt included) that this step's forward computes.

        The whole canvas, except after a block's first forward with a KV cache: "prefix" recomputes the block
        and every later position, "dual" the block alone; the other positions' keys and values come from the
        cache that the block's first forward left.
        """
        if not self.uses_kv_cache or self.block_step == 0:
            return 0, self.length
        start = self.prompt_length + self.block * self.params.block_length
        end = self.length if self.params.kv_cache == "prefix" else start + self.params.block_length
        return start, end

    @property
    def kv_cache_tensor(self) -> torch.Tensor | None:
        """Keys and values of the whole canvas, from the current block's first forward: [n_layers, 2,
        n_kv_heads, length, head_dim], `kv_cache_bytes` in size, a view of the request's row of the pool."""
        return None if self.kv_slot is None else self.kv_slot.view(self)

    def release(self) -> None:
        """Free what the request holds on the device (its KV cache row); called when it ends or is cancelled."""
        if self.kv_slot is not None:
            self.kv_slot.release(self)

    def candidate_offsets(self) -> list[int]:
        """Masked offsets (from the first generated position) of the current block, ascending."""
        start = self.block * self.params.block_length
        return [o for o in range(start, start + self.params.block_length) if self.masked[o]]

    def propose(self, logits: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """For each candidate, the token to commit now, or −1 to leave it masked; stays on the device.

        logits: [N, V] at the candidates; offsets: their canvas positions (only distances matter).
        """
        p = self.params
        if self.generator is None:
            prediction = logits.argmax(-1)
        else:
            # Gumbel-max in float64: argmax(l/T + g), g = −log(−log U), samples softmax(l/T) exactly. It is
            # computed as argmax(l + T·g), the same ranking for any T > 0, because l/T overflows to inf for
            # T near float64's smallest values (1e-308 is a valid temperature) and inf ties are garbage.
            uniform = torch.rand(logits.shape, generator=self.generator, device=logits.device, dtype=torch.float64)
            prediction = (logits.double() - p.temperature * torch.log(-torch.log(uniform))).argmax(-1)
        confidence = confidence_of(logits, prediction, p.confidence_metric)

        count = logits.shape[0]
        last_step = self.block_step >= p.steps_per_block - 1
        if p.confidence_threshold is not None and not last_step:
            # Fast-dLLM's threshold rule: every candidate at or above τ, and always the most confident one (the
            # leftmost among equals), so that each forward commits at least one token.
            chosen = confidence >= p.confidence_threshold
            chosen[confidence.argmax(0, keepdim=True)] = True
            return torch.where(chosen, prediction, -1)
        quota = count if last_step else min(count, self.quotas[self.block_step])
        if quota == count:
            chosen = torch.ones(count, dtype=torch.bool, device=logits.device)
        else:
            chosen = torch.zeros(count, dtype=torch.bool, device=logits.device)
            # Among equal confidences the leftmost position wins, deterministically: argmax returns the
            # first maximum, and the sort is stable.
            if quota == 1:
                chosen[confidence.argmax(0, keepdim=True)] = True  # a 1-element index: no host read
            else:
                chosen[torch.sort(confidence, descending=True, stable=True).indices[:quota]] = True
        if p.use_local_leap:
            chosen |= local_leap_mask(
                confidence,
                offsets,
                p.local_leap_anchor_threshold,
                p.local_leap_neighbor_threshold,
                p.local_leap_radius,
            )
        return torch.where(chosen, prediction, -1)

    def commit(self, offsets: list[int], proposal: list[int]) -> StepEvent:
        """Apply a proposal (brought to the host) and report what became final."""
        p = self.params
        committed = [(offset, token) for offset, token in zip(offsets, proposal) if token >= 0]
        for offset, token in committed:
            self.generated[offset] = token
            self.masked[offset] = False
        self.masked_count -= len(committed)
        self.step_commits.append([offset for offset, _ in committed])
        event_block = self.block
        self.step += 1
        self.block_step += 1

        if self._block_done():
            self.block += 1
            self.block_step = 0
        prefix_grew = self._advance_prefix()

        end = self.stop_offset if self.stop_offset is not None else self.first_masked
        final_ids = self.generated[:end]
        hit_stop_token = self.stop_offset is not None
        ending = self.block == p.num_blocks or (hit_stop_token and p.early_exit)
        # The text can only change when the committed prefix grew (or everything held back is released).
        delta = self.text.update(final_ids, complete=ending) if prefix_grew or ending else ""
        if self.text.stopped:
            ending = True
        if ending:
            self._finish(final_ids, hit_stop_token or self.text.stopped)
        return StepEvent(
            step=self.step - 1,
            block=event_block,
            committed=committed,
            text_delta=delta,
            masked_remaining=self.masked_count,
            finished=self.finished,
            result=self.result,
        )

    def _block_done(self) -> bool:
        """Whether the current block is finished after this step: once it holds no mask (a full block skips its
        remaining steps; LocalLeap can fill one early). Here that is the only way a block ends, so the committed
        prefix reaches gen_length exactly when the last block is done."""
        start = self.block * self.params.block_length
        return not any(self.masked[start : start + self.params.block_length])

    def _advance_prefix(self) -> bool:
        """Extend the committed prefix past newly committed positions, noting its first EOS/EOT.

        Committed tokens never change, so each position is looked at once. Returns whether it grew.
        """
        start = self.first_masked
        while self.first_masked < self.params.gen_length and not self.masked[self.first_masked]:
            if self.stop_offset is None and self.generated[self.first_masked] in self.stop_ids:
                self.stop_offset = self.first_masked
            self.first_masked += 1
        return self.first_masked > start

    def _finish(self, final_ids: list[int], stopped: bool) -> None:
        token_ids = final_ids
        if self.text.stopped:
            token_ids = self._tokens_covering(final_ids, self.text.emitted)
        self.finished = True
        self.release()
        self.result = GenerationResult(
            token_ids=token_ids,
            canvas_ids=list(self.generated),
            text=self.text.emitted,
            finish_reason="stop" if stopped else "length",
            num_forward_passes=self.step,
            prompt_tokens=self.prompt_length,
            params=self.params,
            step_commits=self.step_commits,
        )

    def _tokens_covering(self, ids: list[int], text: str) -> list[int]:
        """The shortest prefix of `ids` whose text reaches the stop-string cut (usage counts these)."""
        for size in range(len(ids) + 1):
            if self._decode(ids[:size]).startswith(text):
                return ids[:size]
        return ids
