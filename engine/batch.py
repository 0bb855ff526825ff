"""One denoising step for a batch of requests: one left-padded forward, then each request's own sampler step.

Requests of any prompt length, canvas size and sampling settings can share the forward: rows are
left-padded (RoPE depends only on relative offsets, so a padded row computes the same logits), and the
last block and the LM head run only at each request's candidate positions. The host waits on the device
exactly once per step, when the proposals (one small tensor for the whole batch) come back.
"""

from __future__ import annotations

from itertools import chain

import torch

from engine.model import LLaDAModelLM, LogitIndex
from engine.sampler import DenoisingRequest, StepEvent


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A step's inputs, gathered on the host as one list of ints, become one tensor: ONE host-to-device copy.

    On CUDA the host tensor is created pinned, so the copy is asynchronous: the host queues the forward
    right behind it instead of waiting for it (a pageable copy would block). On CPU it is used as it is.
    """
    host = torch.tensor(values, dtype=torch.long, pin_memory=device.type == "cuda")
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


@torch.inference_mode()
def denoise_step(
    model: LLaDAModelLM, requests: list[DenoisingRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one step. A request whose sampler step raises gets its exception back
    in its slot; the others are unaffected. A failing forward raises (it concerns the whole batch)."""
    batch, width = len(requests), max(r.length for r in requests)
    pads = [width - r.length for r in requests]
    padded = any(pads)
    offsets = [r.candidate_offsets() for r in requests]
    sizes = [len(o) for o in offsets]
    per_row = max(sizes)
    ragged = any(size != per_row for size in sizes)  # then the [B, M] grid has filler entries to drop

    # The step's inputs, host side: canvases, then the candidates' canvas columns as a [B, M] grid (a row
    # with fewer fills it with its last column: any of its own columns would do, and left padding never
    # reaches the last one) and as a flat list.
    ids, mask, grid, real, cols = [], [], [], [], []
    for row, (request, request_offsets, pad) in enumerate(zip(requests, offsets, pads)):
        ids += [pad_id] * pad
        ids += request.prompt_ids
        ids += request.generated
        if padded:
            mask += [0] * pad + [1] * request.length
        shift = pad + request.prompt_length
        row_cols = [offset + shift for offset in request_offsets]
        cols += row_cols
        grid += row_cols + [width - 1] * (per_row - len(row_cols))
        if ragged:
            real += range(row * per_row, row * per_row + len(row_cols))
    sections = [ids, mask, grid, real, cols]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, attention_mask, candidate_grid, real_entries, candidate_cols = on_device
    logits = model(
        input_ids.view(batch, width),
        attention_mask.view(batch, width) if padded else None,
        logit_index=LogitIndex(candidate_grid.view(batch, per_row), real_entries if ragged else None),
    )

    proposals: list[torch.Tensor | Exception] = []
    start = 0
    for request, size in zip(requests, sizes):
        end = start + size
        try:
            # Padded columns keep the distances between a row's positions: all LocalLeap needs.
            proposals.append(request.propose(logits[start:end], candidate_cols[start:end]))
        except Exception as error:  # noqa: BLE001 - isolate one request's failure from its batch-mates
            proposals.append(error)
        start = end

    good = [p for p in proposals if not isinstance(p, Exception)]
    if good:
        # The one synchronisation of the step: every proposal comes to the host in a single copy.
        packed = torch.cat(good).tolist()
    events: list[StepEvent | Exception] = []
    at = 0
    for request, request_offsets, size, proposal in zip(requests, offsets, sizes, proposals):
        if isinstance(proposal, Exception):
            events.append(proposal)
            continue
        try:
            events.append(request.commit(request_offsets, packed[at : at + size]))
        except Exception as error:  # noqa: BLE001
            events.append(error)
        at += size
    return events
