"""One denoising step for a batch of requests: one left-padded forward, then each request's own sampler step.

Requests of any prompt length, canvas size and sampling settings can share the forward: rows are
left-padded (RoPE depends only on relative offsets, so a padded row computes the same logits), and the
LM head runs only at each request's candidate positions. The host waits on the device exactly once per
step, when the proposals (a few small tensors for the whole batch) come back.
"""

from __future__ import annotations

import torch

from engine.model import LLaDAModelLM
from engine.sampler import DenoisingRequest, StepEvent


def _staging(size: int, device: torch.device) -> torch.Tensor:
    """Host memory for one step's inputs, packed so that they travel in ONE host-to-device copy.

    On CUDA it is pinned, so the copy is asynchronous: the host queues the forward right behind it instead
    of waiting for it (a pageable copy would block). Pinned blocks come from torch's caching host
    allocator, which reuses them across steps and keeps a block alive until the copy reading it is done.
    """
    return torch.empty(size, dtype=torch.long, pin_memory=device.type == "cuda")


@torch.inference_mode()
def denoise_step(
    model: LLaDAModelLM, requests: list[DenoisingRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one step. A request whose sampler step raises gets its exception back
    in its slot; the others are unaffected. A failing forward raises (it concerns the whole batch)."""
    batch, width = len(requests), max(r.length for r in requests)
    padded = any(r.length != width for r in requests)
    offsets = [r.candidate_offsets() for r in requests]
    candidates = sum(o.shape[0] for o in offsets)
    # One long buffer: [input_ids (B·T) | attention_mask (B·T, only when padded) | rows (N) | cols (N)].
    grid = batch * width
    mask_size = grid if padded else 0
    host = _staging(grid + mask_size + 2 * candidates, device)
    input_ids = host[:grid].view(batch, width).fill_(pad_id)
    attention_mask = host[grid : grid + mask_size].view(batch, width).zero_() if padded else None
    rows = host[grid + mask_size : grid + mask_size + candidates]
    cols = host[grid + mask_size + candidates :]
    at = 0
    for row, (request, request_offsets) in enumerate(zip(requests, offsets)):
        pad = width - request.length
        input_ids[row, pad:] = request.canvas
        if attention_mask is not None:
            attention_mask[row, pad:] = 1
        size = request_offsets.shape[0]
        rows[at : at + size] = row
        cols[at : at + size] = request_offsets + pad + request.prompt_length
        at += size

    on_device = host.to(device, non_blocking=True)  # on CPU this is `host` itself: no copy
    device_cols = on_device[grid + mask_size + candidates :]
    logits = model(
        on_device[:grid].view(batch, width),
        on_device[grid : grid + mask_size].view(batch, width) if padded else None,
        logit_index=(on_device[grid + mask_size : grid + mask_size + candidates], device_cols),
    )

    proposals: list[tuple[torch.Tensor, torch.Tensor] | Exception] = []
    start = 0
    for request, request_offsets in zip(requests, offsets):
        end = start + request_offsets.shape[0]
        try:
            # Padded columns keep the distances between a row's positions: all LocalLeap needs.
            proposals.append(request.propose(logits[start:end], device_cols[start:end]))
        except Exception as error:  # noqa: BLE001 - isolate one request's failure from its batch-mates
            proposals.append(error)
        start = end

    good = [p for p in proposals if not isinstance(p, Exception)]
    if good:
        # The one synchronisation of the step: every proposal comes to the host in a single copy.
        packed = torch.stack((torch.cat([p[0] for p in good]), torch.cat([p[1] for p in good]).long())).cpu()
        predictions, chosen = packed[0], packed[1].bool()
    events: list[StepEvent | Exception] = []
    at = 0
    for request, request_offsets, proposal in zip(requests, offsets, proposals):
        if isinstance(proposal, Exception):
            events.append(proposal)
            continue
        size = request_offsets.shape[0]
        try:
            events.append(request.commit(request_offsets, predictions[at : at + size], chosen[at : at + size]))
        except Exception as error:  # noqa: BLE001
            events.append(error)
        at += size
    return events
