"""The official LLaDA2.0 / LLaDA2.1 `generate()`, written plainly: the uncached baseline the engine is measured against.

What inclusionAI's `modeling_llada2_moe.py` does (tests/fixtures/llada2-tiny/README.md, section 5), on this
project's model (engine/llada2.py) without its cache: for every forward of block b the model runs over the whole
canvas prefix [0, (b+1)·B) with the block-causal mask, and the LM head runs at every one of those positions; the
sampler then looks at the current block's logits only. One request at a time. Used for comparison and by
tests/test_llada2_reference_loop.py, never by the server.

- LLaDA2.0 (`editing_threshold=None`): at most `steps` forwards per block following the uniform transfer
  schedule; a forward commits every masked position strictly above `threshold` if there are at least the
  schedule's quota of them, else the quota's most confident; `eos_early_stop` returns inside a block (the
  prompt included) once an EOS is committed with nothing masked before it; a block that ends holding EOS
  ends generation.
- LLaDA2.1 (`editing_threshold` set): no schedule; each forward commits as above with `num_to_transfer` as the
  quota and, from the same forward, overwrites every already written, non-prompt position of the block whose
  prediction differs and is strictly above `editing_threshold`; a block ends after a forward that started with
  no mask and edited nothing, or when a forward would be the (`max_post_steps` + 1)-th without masks.
  With `eos_early_stop` a finished block holding EOS (and no mask before the block's end) ends generation.

`attention="shipped_01"` reproduces the shipped 2.1 code's bug (its 0/1 mask is added to the scores, hiding
nothing), only to show the loop also matches the fixture's `llada21` cases; the default is the block-causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.llada2 import LLaDA2MoeModelLM, block_causal_mask


@dataclass
class ForwardRecord:
    """What one forward decided: absolute canvas positions written mask → token and token → token."""

    window_length: int
    committed: list[int]
    edited: list[int]


@dataclass
class ReferenceResult:
    output_ids: list[int]  # what generate() returns (prompt included after 2.0's in-block EOS exit)
    output_includes_prompt: bool
    canvas: list[int]  # the whole internal canvas at return
    forwards: list[ForwardRecord] = field(default_factory=list)

    @property
    def num_forwards(self) -> int:
        return len(self.forwards)


def transfer_schedule(block_length: int, steps: int) -> list[int]:
    """`steps` quotas summing to the block: floor(B / steps) each, the first (B mod steps) one more."""
    base, extra = divmod(block_length, steps)
    return [base + (i < extra) for i in range(steps)]


def keep_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    if not top_k or top_k <= 0:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Drop a token once the probability of the tokens ranked before it already exceeds p (the best stays)."""
    if top_p is None or top_p >= 1.0:
        return logits
    ordered, order = torch.sort(logits, descending=True, dim=-1)
    before = torch.softmax(ordered, dim=-1).cumsum(-1) > top_p
    drop_sorted = torch.zeros_like(before)
    drop_sorted[..., 1:] = before[..., :-1]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """Candidate token and its confidence at each row of `logits` [L, V] (float32), as the official sampler does:
    greedy with the softmax probability at T = 0; else tempered, filtered, one multinomial draw per row."""
    if temperature == 0:
        token = logits.argmax(-1, keepdim=True)
        probs = torch.softmax(logits, dim=-1)
    else:
        if temperature != 1.0:
            logits = logits / temperature
        logits = keep_top_p(keep_top_k(logits, top_k), top_p)
        probs = torch.softmax(logits, dim=-1)
        token = torch.multinomial(probs, num_samples=1)
    return token.squeeze(-1), probs.gather(-1, token).squeeze(-1)


def commit_masked(confidence: torch.Tensor, masked: torch.Tensor, threshold: float | None, quota: int) -> torch.Tensor:
    """Masked positions strictly above the threshold if there are at least `quota`, else the `quota` most confident
    masked ones (quota capped at the number of masks)."""
    quota = min(quota, int(masked.sum()))
    chosen = torch.zeros_like(masked)
    if quota == 0:
        return chosen
    if threshold is not None:
        above = masked & (confidence > threshold)
        if int(above.sum()) >= quota:
            return above
    ranked = torch.where(masked, confidence, float("-inf"))
    chosen[torch.topk(ranked, quota).indices] = True
    return chosen


@torch.inference_mode()
def reference_generate(
    model: LLaDA2MoeModelLM,
    prompt_ids: list[int],
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    eos_id: int | None,
    steps: int = 32,
    threshold: float | None = 0.95,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_early_stop: bool = False,
    minimal_topk: int = 1,
    editing_threshold: float | None = None,
    max_post_steps: int = 16,
    num_to_transfer: int = 1,
    attention: str = "block_causal",
) -> ReferenceResult:
    """One official `generate()` call (batch of one). `eos_id=None`: no token ends generation (the benchmark uses
    it to keep the work fixed). `threshold=None`: the quota alone decides (as a threshold of 1.0 would)."""
    device = model.lm_head.weight.device
    prompt = len(prompt_ids)
    total = -(-(prompt + gen_length) // block_length) * block_length
    x = torch.full((total,), mask_id, dtype=torch.long, device=device)
    x[:prompt] = torch.tensor(prompt_ids, dtype=torch.long, device=device)
    is_prompt = torch.zeros(total, dtype=torch.bool, device=device)
    is_prompt[:prompt] = True
    allowed = block_causal_mask(total, block_length, device)
    if attention == "block_causal":
        additive = torch.zeros(total, total, device=device).masked_fill(~allowed, float("-inf"))
    elif attention == "shipped_01":
        additive = allowed.float()  # the shipped 2.1 bug: 1 where allowed is added, nothing is hidden
    else:
        raise ValueError(f"attention must be 'block_causal' or 'shipped_01', not {attention!r}")
    editing = editing_threshold is not None
    steps = min(steps, gen_length // minimal_topk)
    schedule = transfer_schedule(block_length, steps)
    forwards: list[ForwardRecord] = []

    def finish(ids: torch.Tensor, includes_prompt: bool) -> ReferenceResult:
        out = ids.tolist()
        if eos_id is not None and eos_id in out[prompt if includes_prompt else 0 :]:
            out = out[: out.index(eos_id, prompt if includes_prompt else 0) + 1]
        return ReferenceResult(out, includes_prompt, x.tolist(), forwards)

    for block in range(prompt // block_length, total // block_length):
        start, end = block * block_length, (block + 1) * block_length
        window = x[:end]
        mask = additive[:end, :end][None, None]
        positions = torch.arange(end, device=device)[None]
        post_steps = 0
        for step in range(10**9 if editing else steps):
            block_tokens = window[start:end]
            masked = block_tokens == mask_id
            any_mask = bool(masked.any())
            if not editing and not any_mask:
                break
            if editing and not any_mask:
                post_steps += 1
                if post_steps > max_post_steps:
                    break
            logits = model(window[None], attention_mask=mask, position_ids=positions)[0]  # [end, V]: every position
            token, confidence = sample(logits[start:end], temperature, top_k, top_p)
            quota = num_to_transfer if editing else schedule[step]
            commit = commit_masked(confidence, masked, threshold, quota)
            edit = torch.zeros_like(commit)
            if editing:
                writable = ~masked & ~is_prompt[start:end]
                edit = writable & (confidence > editing_threshold) & (token != block_tokens)
            write = commit | edit
            block_tokens[write] = token[write]  # a view of x: the canvas itself changes
            committed = (torch.nonzero(commit).flatten() + start).tolist()
            forwards.append(ForwardRecord(end, committed, (torch.nonzero(edit).flatten() + start).tolist()))
            if editing and not any_mask and not bool(edit.any()):
                break
            if not editing and eos_early_stop and eos_id is not None and bool((token[commit] == eos_id).any()):
                # The first EOS of the window (searched from position 0), with nothing masked between the
                # prompt and it: return the canvas up to it, prompt included.
                first = int(torch.nonzero(window == eos_id)[0])
                if not bool((window[prompt:first] == mask_id).any()):
                    return finish(window[: first + 1], includes_prompt=True)
        answer = x[prompt:end]
        holds_eos = eos_id is not None and bool((answer == eos_id).any())
        if editing:
            if eos_early_stop and holds_eos and not bool((answer == mask_id).any()):
                break
        elif holds_eos:
            break
    return finish(x[prompt : prompt + gen_length], includes_prompt=False)
