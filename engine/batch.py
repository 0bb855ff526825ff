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


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


@torch.inference_mode()
def denoise_step(
    model: LLaDAModelLM, requests: list[DenoisingRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one step. A request whose sampler step raises gets its exception back
    in its slot; the others are unaffected. A failing forward raises (it concerns the whole batch)."""
    width = max(r.length for r in requests)
    input_ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    padded = any(r.length != width for r in requests)
    attention_mask = torch.zeros((len(requests), width), dtype=torch.long) if padded else None
    offsets = [r.candidate_offsets() for r in requests]
    rows, cols = [], []
    for row, (request, request_offsets) in enumerate(zip(requests, offsets)):
        pad = width - request.length
        input_ids[row, pad:] = request.canvas
        if attention_mask is not None:
            attention_mask[row, pad:] = 1
        rows.append(torch.full_like(request_offsets, row))
        cols.append(request_offsets + pad + request.prompt_length)
    rows_t, cols_t = torch.cat(rows), torch.cat(cols)

    device_cols = _to_device(cols_t, device)
    logits = model(
        _to_device(input_ids, device),
        None if attention_mask is None else _to_device(attention_mask, device),
        logit_index=(_to_device(rows_t, device), device_cols),
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
        # The one synchronisation of the step: all proposals come to the host together.
        predictions = torch.cat([p[0] for p in good]).cpu()
        chosen = torch.cat([p[1] for p in good]).cpu()
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
