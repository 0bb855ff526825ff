"""The block-diffusion sampler (LLaDA2.0 and LLaDA2.1), one request at a time (docs/sampler.md, "Block diffusion").

A `BlockDiffusionRequest` has the interface the scheduler and the batch step use for `DenoisingRequest`
(`forward_span`, `candidate_offsets`, the `propose` / `commit` split, `StepEvent`, `GenerationResult`,
`release`, `kv_cache_bytes`, `finished` / `result`); engine/block_step.py runs its forwards.

The canvas follows the official `generate()` (tests/fixtures/llada2-tiny/README.md, section 5):
- blocks are aligned to absolute positions 0, B, 2B, …, the prompt included: the canvas is
  ceil((P + G) / B) · B long and denoising starts at the block holding the prompt's end. Positions past
  P + G are denoised with their block but never returned;
- LLaDA2.0 (`editing_threshold` unset): a block takes at most `steps_per_block` forwards; forward s commits
  every masked position whose confidence is strictly above `confidence_threshold` if there are at least
  quota[s] of them (quota = the uniform schedule), else the quota[s] most confident ones;
- LLaDA2.1 (`editing_threshold` set): no schedule; each forward commits the masked positions strictly above
  the threshold if there are at least `min_tokens_per_step`, else that many most confident ones, and, from the
  same forward, overwrites every already written (non-prompt) position of the block whose prediction differs
  and whose confidence is strictly above `editing_threshold`. A block ends after a forward that found no mask
  and edited nothing (so there is one check forward after the last mask), or after `max_post_steps` forwards
  without masks.
Ties are decided deterministically: among equal confidences the leftmost position wins (a stable sort), where
the official code leaves the order to `torch.topk`.

EOS: `early_exit` is the official `eos_early_stop`. 2.0: when a forward commits a stop token and everything
before the first stop token is written, the request ends at once; and a block that closes with a stop token in
the answer ends generation whatever `early_exit` says. 2.1: only with `early_exit`, a closed block with a stop
token in the answer ends generation. The stop tokens are the tokenizer's (EOS and end of turn); the official
code looks for EOS alone, and from position 0 (the prompt included), where this looks in the answer only.

The exact KV cache: attention is block-causal, so the keys and values of the prompt and of finished blocks never
change. A request's cache is a row of the model's preallocated KV pool (engine/kv_slots.py, the same pool the
approximate caches of LLaDA and Dream use), taken at its first forward and given back by `release` when it ends
or is cancelled; `kv_cache_tensor` is the row's first `canvas_length` columns (`kv_cache_bytes` in size), and
column c holds canvas position c. Each forward computes only [first uncached block, current block end)
(`forward_span`): the current block, plus, at a block's first forward, the block that has just been finished
(its keys are taken with its final tokens then), and writes their keys and values into the row in place.

Streaming: the text of a position is final once it can no longer change. Without editing that is when it is
committed (the committed prefix is streamed, as for the other families); with editing a written token can still
be overwritten until its block closes, so text becomes final block by block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.params import SamplingParams
from engine.sampler import GenerationResult, StepEvent
from engine.schedules import uniform_quotas
from engine.text import IncrementalText


class BlockDiffusionRequest:
    """One request's canvas, block position and cache. Host state is plain lists, like DenoisingRequest's."""

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
    ):
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.mask_id = mask_id
        self.stop_ids = stop_ids
        self._decode = decode
        block = params.block_length
        prompt = len(self.prompt_ids)
        self.canvas_length = -(-(prompt + params.gen_length) // block) * block
        self.generated = [mask_id] * (self.canvas_length - prompt)  # every canvas position after the prompt
        self.block = prompt // block  # absolute index of the current block
        self.last_block = self.canvas_length // block - 1
        self.editing = params.editing_threshold is not None  # LLaDA2.1's sampler
        self.block_step = 0  # forwards run in the current block
        self.post_steps = 0  # 2.1: forwards of the current block that began with no mask
        if not self.editing:
            self.quotas = uniform_quotas(block, params.steps_per_block)
        self.cached_until = 0  # canvas positions [0, cached_until) have final keys in the request's pool row
        # From here on the same state as DenoisingRequest's, under the same names: the scheduler, the batch step and
        # the stats read both kinds alike. Written out twice on purpose: a shared base class would hold only these
        # assignments and hide which state each sampler owns.
        self.step = 0
        self.final_until = 0  # generated offsets [0, final_until) can no longer change
        self.step_commits: list[list[int]] = []
        self.step_edits: list[list[int]] = []
        self.text = IncrementalText(decode, params.stop)
        self.finished = False
        self.result: GenerationResult | None = None
        self.generator = None
        if params.temperature > 0:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        # The row of the model's KV pool (engine/kv_slots.py) that holds this request's keys and values from its
        # first forward to its end; engine/block_step.py takes it and writes it. None: no forward yet, or ended.
        self.kv_slot = None
        self.kv_cache_bytes = kv_cache_bytes

    # --- what the scheduler and the batch step read ---------------------------------------------------------

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_ids)

    @property
    def length(self) -> int:
        """Positions of the whole canvas, prompt included (what the cache holds)."""
        return self.canvas_length

    @property
    def block_start(self) -> int:
        return self.block * self.params.block_length

    def forward_span(self) -> tuple[int, int]:
        """Canvas positions [start, end) that the next forward computes: from the first position whose keys
        are not cached yet to the end of the current block (at a block's first forward this takes in the
        block just finished, whose keys are then final)."""
        return self.cached_until, self.block_start + self.params.block_length

    def canvas_slice(self, start: int, end: int) -> list[int]:
        """Canvas tokens [start, end), prompt included (without building the whole canvas)."""
        prompt = self.prompt_length
        return self.prompt_ids[start:end] + self.generated[max(start - prompt, 0) : max(end - prompt, 0)]

    def candidate_offsets(self) -> list[int]:
        """Offsets (from the first generated position) whose logits the next forward returns, ascending: the
        current block's masked positions, and with editing also its written ones (never the prompt's)."""
        start = max(self.block_start - self.prompt_length, 0)
        end = self.block_start + self.params.block_length - self.prompt_length
        if self.editing:
            return list(range(start, end))
        return [o for o in range(start, end) if self.generated[o] == self.mask_id]

    @property
    def kv_cache_tensor(self) -> torch.Tensor | None:
        """Keys and values of the whole canvas, [n_layers, 2, n_kv_heads, canvas_length, head_dim],
        `kv_cache_bytes` in size: a view of the request's row of the pool (None before its first forward)."""
        return None if self.kv_slot is None else self.kv_slot.view(self)

    def release(self) -> None:
        """Give the request's pool row back; called when it ends or is cancelled."""
        if self.kv_slot is not None:
            self.kv_slot.release(self)

    # --- the step: propose on the device, commit on the host ------------------------------------------------

    def propose(self, logits: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """For each candidate, the token to write now, or −1; stays on the device (no host synchronisation).

        logits: [N, V] at `candidate_offsets()`; current: [N] their tokens now (mask id where masked).
        """
        p = self.params
        if self.generator is None:
            probs = torch.softmax(logits.float(), dim=-1)
            prediction = probs.argmax(-1)
        else:
            # Gumbel-max samples softmax(logits / T); the confidence is the drawn token's tempered probability,
            # as the official sampler reports it.
            # Shifted by the maximum before dividing, so that a tiny T gives -inf (not inf - inf) off the maximum.
            shifted = logits.double() - logits.double().amax(-1, keepdim=True)
            probs = torch.softmax(shifted / p.temperature, dim=-1)
            uniform = torch.rand(logits.shape, generator=self.generator, device=logits.device, dtype=torch.float64)
            prediction = (logits.double() - p.temperature * torch.log(-torch.log(uniform))).argmax(-1)
        confidence = probs.gather(-1, prediction[:, None]).squeeze(-1).float()

        masked = current == self.mask_id
        masks = sum(self.generated[o] == self.mask_id for o in self._offsets_of_block())  # host-side count
        if self.editing:
            quota = min(p.min_tokens_per_step, masks)
        else:
            quota = min(self.quotas[self.block_step], masks)
        chosen = self._mask_to_token(confidence, masked, quota)
        if self.editing:
            # Token → token: a written position whose prediction differs, strictly above the editing threshold.
            chosen |= ~masked & (prediction != current) & (confidence > p.editing_threshold)
        return torch.where(chosen, prediction, -1)

    def _mask_to_token(self, confidence: torch.Tensor, masked: torch.Tensor, quota: int) -> torch.Tensor:
        """Masked candidates strictly above the threshold if there are at least `quota`, else the `quota` most
        confident masked ones (the leftmost among equals). Decided on the device."""
        if quota == 0:
            return torch.zeros_like(masked)
        ranked = torch.where(masked, confidence, -1.0)
        top = torch.zeros_like(masked)
        top[torch.sort(ranked, descending=True, stable=True).indices[:quota]] = True
        threshold = self.params.confidence_threshold
        if threshold is None:
            return top
        above = masked & (confidence > threshold)
        return torch.where(above.sum() >= quota, above, top)

    def _offsets_of_block(self) -> range:
        start = max(self.block_start - self.prompt_length, 0)
        return range(start, self.block_start + self.params.block_length - self.prompt_length)

    def commit(self, offsets: list[int], proposal: list[int]) -> StepEvent:
        """Apply a proposal (brought to the host), move the block on, report what became final."""
        p = self.params
        block_offsets = self._offsets_of_block()
        masks_before = sum(self.generated[o] == self.mask_id for o in block_offsets)
        committed, edited = [], []
        for offset, token in zip(offsets, proposal):
            if token < 0:
                continue
            (committed if self.generated[offset] == self.mask_id else edited).append((offset, token))
            self.generated[offset] = token
        self.step_commits.append([offset for offset, _ in committed])
        self.step_edits.append([offset for offset, _ in edited])
        event_block = self.block - self.prompt_length // p.block_length  # 0 = the block holding the prompt's end
        # This forward computed the blocks before the current one with their final tokens.
        self.cached_until = self.block_start
        self.step += 1
        self.block_step += 1

        stop_now = False
        if self.editing:
            block_done = self._editing_block_done(masks_before, edited)
        else:
            # The schedule's steps can run out with masks left only if the model predicted the mask token itself.
            block_done = self.block_step >= p.steps_per_block or not any(
                self.generated[o] == self.mask_id for o in block_offsets
            )
            if p.early_exit and any(token in self.stop_ids for _, token in committed):
                stop_now = self._answer_written_up_to_a_stop()
        if block_done and not stop_now:
            # A closed block holding a stop token ends generation (2.0 always, 2.1 with early_exit).
            answer_end = min(self.block_start + p.block_length - self.prompt_length, p.gen_length)
            holds_stop = any(t in self.stop_ids for t in self.generated[:answer_end])
            stop_now = holds_stop and (p.early_exit or not self.editing)
            self.block += 1
            self.block_step = 0
            self.post_steps = 0
            if self.block > self.last_block:
                stop_now = True

        grew = self._advance_final(everything=stop_now)
        final_ids = self._answer(self.final_until)
        delta = self.text.update(final_ids, complete=stop_now) if grew or stop_now else ""
        if self.text.stopped:
            stop_now = True
        if stop_now:
            self._finish()
        return StepEvent(
            step=self.step - 1,
            block=event_block,
            committed=committed,
            text_delta=delta,
            masked_remaining=sum(t == self.mask_id for t in self.generated[: p.gen_length]),
            finished=self.finished,
            result=self.result,
            edited=edited,
        )

    def _editing_block_done(self, masks_before: int, edited: list) -> bool:
        """2.1's loop: a forward that began with no mask and edited nothing ends the block; so does the top of
        the next iteration when it would be the (max_post_steps + 1)-th forward without masks."""
        if masks_before == 0 and not edited:
            return True
        if any(self.generated[o] == self.mask_id for o in self._offsets_of_block()):
            return False
        self.post_steps += 1
        return self.post_steps > self.params.max_post_steps

    def _answer_written_up_to_a_stop(self) -> bool:
        """2.0's in-block exit: the first stop token of the window (the canvas up to the current block's end,
        as the official code searches it) has no mask before it."""
        for token in self.generated[: self._offsets_of_block().stop]:
            if token == self.mask_id:
                return False
            if token in self.stop_ids:
                return True
        return False

    def _advance_final(self, everything: bool) -> bool:
        """Move `final_until` over what can no longer change; returns whether it grew.

        Without editing a committed token is final, so the written prefix is; with editing, only closed blocks
        are. At the end everything written is final.
        """
        before = self.final_until
        limit = self.params.gen_length
        if self.params.uses_editing and not everything:  # an editing_threshold of 1 never overwrites
            limit = min(limit, max(self.block_start - self.prompt_length, 0))
        while self.final_until < limit and self.generated[self.final_until] != self.mask_id:
            self.final_until += 1
        return self.final_until > before

    def _answer(self, end: int) -> list[int]:
        """The answer's tokens in [0, end), cut before the first stop token."""
        ids = self.generated[:end]
        for i, token in enumerate(ids):
            if token in self.stop_ids:
                return ids[:i]
        return ids

    def _finish(self) -> None:
        token_ids = self._answer(self.final_until)
        stopped = len(token_ids) < self.final_until or self.text.stopped
        if self.text.stopped:
            token_ids = self._tokens_covering(token_ids, self.text.emitted)
        self.finished = True
        self.release()
        self.result = GenerationResult(
            token_ids=token_ids,
            canvas_ids=self.generated[: self.params.gen_length],
            text=self.text.emitted,
            finish_reason="stop" if stopped else "length",
            num_forward_passes=self.step,
            prompt_tokens=self.prompt_length,
            params=self.params,
            step_commits=self.step_commits,
            step_edits=self.step_edits,
        )

    def _tokens_covering(self, ids: list[int], text: str) -> list[int]:
        """The shortest prefix of `ids` whose text reaches the stop-string cut (usage counts these)."""
        for size in range(len(ids) + 1):
            if self._decode(ids[:size]).startswith(text):
                return ids[:size]
        return ids
