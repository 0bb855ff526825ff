"""One denoising step for a batch of requests: one left-padded forward, then each request's own sampler step.

Requests of any prompt length, canvas size and sampling settings can share the forward: rows are
left-padded (RoPE depends only on relative offsets, so a padded row computes the same logits), and the
last block and the LM head run only at each request's candidate positions. The host waits on the device
exactly once per step, when the proposals (one small tensor for the whole batch) come back.

Requests with a KV cache (kv_cache "prefix" or "dual") compute only part of their canvas after a block's
first forward. A batch holding one runs as a `KVFrame` forward: each row computes its own `forward_span()`
(a row with a shorter span fills up with entries aimed at a hidden "filler" key column), cached rows bring
their keys and values into the frame's buffer, and rows at a block's first forward take theirs out of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from engine.block_sampler import BlockDiffusionRequest
from engine.model import KVFrame, LLaDAModelLM, LogitIndex
from engine.sampler import DenoisingRequest, StepEvent


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A step's inputs, gathered on the host as one list of ints, become one tensor: ONE host-to-device copy.

    On CUDA the host tensor is created pinned, so the copy is asynchronous: the host queues the forward
    right behind it instead of waiting for it (a pageable copy would block). On CPU it is used as it is.
    """
    host = torch.tensor(values, dtype=torch.long, pin_memory=device.type == "cuda")
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


@dataclass(frozen=True)
class _Row:
    """Where one request sits in the step's forward."""

    request: DenoisingRequest
    offsets: list[int]  # candidate offsets (from the first generated position), ascending
    pad: int  # left-padding columns
    start: int  # canvas positions [start, end) that the forward computes (prompt included)
    end: int

    @property
    def computes_all(self) -> bool:
        return self.start == 0 and self.end == self.request.length


@torch.inference_mode()
def denoise_step(
    model: LLaDAModelLM, requests: list[DenoisingRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one step. A request whose sampler step raises gets its exception back
    in its slot; the others are unaffected. A failing forward raises (it concerns the whole batch).

    Block-diffusion requests (LLaDA2) take a step of their own, engine/block_step.py; a model holds one
    family, so a batch is all of one kind.
    """
    if isinstance(requests[0], BlockDiffusionRequest):
        from engine.block_step import block_denoise_step  # it imports this module's helpers

        return block_denoise_step(model, requests, device, pad_id)
    width = max(r.length for r in requests)
    rows = [_Row(r, r.candidate_offsets(), width - r.length, *r.forward_span()) for r in requests]
    if any(r.uses_kv_cache for r in requests):
        logits, candidate_cols = _cached_forward(model, rows, width, device, pad_id)
    else:
        logits, candidate_cols = _full_forward(model, rows, width, device, pad_id)
    # Padded columns keep the distances between a row's positions: all LocalLeap needs.
    return propose_and_commit([row.request for row in rows], [row.offsets for row in rows], logits, candidate_cols)


def _candidate_grid(columns: list[list[int]]) -> tuple[list[int], list[int], int]:
    """The candidates' columns as a [B, M] grid (a row with fewer fills it with its last column: it is computed
    and dropped) and the flat indices of the real entries (empty when no row needed filling), and M."""
    per_row = max(len(row_cols) for row_cols in columns)
    grid, real = [], []
    ragged = any(len(row_cols) != per_row for row_cols in columns)
    for row, row_cols in enumerate(columns):
        grid += row_cols + [row_cols[-1]] * (per_row - len(row_cols))
        if ragged:
            real += range(row * per_row, row * per_row + len(row_cols))
    return grid, real, per_row


def _full_forward(model, rows: list[_Row], width: int, device, pad_id: int):
    """Every row computes its whole (left-padded) canvas: the reference path."""
    batch = len(rows)
    padded = any(row.pad for row in rows)
    # The step's inputs, host side: canvases, then the candidates' canvas columns (the grid's filler is the
    # row's last candidate column), then the same columns as a flat list.
    ids, mask, columns = [], [], []
    for row in rows:
        request, shift = row.request, row.pad + row.request.prompt_length
        ids += [pad_id] * row.pad
        ids += request.prompt_ids
        ids += request.generated
        if padded:
            mask += [0] * row.pad + [1] * request.length
        columns.append([offset + shift for offset in row.offsets])
    grid, real, per_row = _candidate_grid(columns)
    sections = [ids, mask, grid, real, list(chain(*columns))]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, attention_mask, candidate_grid, real_entries, candidate_cols = on_device
    logits = model(
        input_ids.view(batch, width),
        attention_mask.view(batch, width) if padded else None,
        logit_index=LogitIndex(candidate_grid.view(batch, per_row), real_entries if real else None),
    )
    return logits, candidate_cols


def _cached_forward(model, rows: list[_Row], width: int, device, pad_id: int):
    """Each row computes its forward span; keys and values travel through a KVFrame buffer.

    A lone request uses its own cache as the buffer (its fresh keys and values are written into it in place,
    which is harmless: those columns are recomputed at every step before they are read again). Otherwise the
    cached rows are copied into a zeroed buffer, and rows at a block's first forward keep a copy of theirs.
    """
    batch = len(rows)
    computed = max(row.end - row.start for row in rows)
    ragged = any(row.end - row.start != computed for row in rows)
    filler_column = width  # one extra key column, always hidden, for the entries of shorter rows
    key_width = width + ragged
    hide_keys = ragged or any(row.pad for row in rows)

    ids, columns_of_computed, positions, key_mask, candidates, cols = [], [], [], [], [], []
    for row in rows:
        request, fill = row.request, computed - (row.end - row.start)
        canvas = request.prompt_ids + request.generated
        ids += canvas[row.start : row.end] + [pad_id] * fill
        columns_of_computed += range(row.pad + row.start, row.pad + row.end)
        columns_of_computed += [filler_column] * fill
        positions += range(row.start, row.end)
        positions += [0] * fill
        if hide_keys:
            key_mask += [0] * row.pad + [1] * request.length + [0] * ragged
        # The logits are wanted at the candidates, counted within the row's computed span.
        candidates.append([request.prompt_length + offset - row.start for offset in row.offsets])
        cols += [row.pad + request.prompt_length + offset for offset in row.offsets]
    grid, real, per_row = _candidate_grid(candidates)
    sections = [ids, columns_of_computed, positions, key_mask, grid, real, cols]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, computed_columns, computed_positions, key_mask_t, candidate_grid, real_entries, candidate_cols = (
        on_device
    )

    lone = rows[0] if batch == 1 else None
    if lone is not None and not lone.computes_all:
        buffer = lone.request.kv_cache_tensor[:, :, None]
    else:
        buffer = model.new_kv_buffer(batch, key_width)
        for index, row in enumerate(rows):
            if not row.computes_all:
                buffer[:, :, index, :, row.pad : row.pad + row.request.length] = row.request.kv_cache_tensor
    frame = KVFrame(
        buffer,
        computed_columns.view(batch, computed),
        computed_positions.view(batch, computed),
        key_mask_t.view(batch, key_width).bool() if hide_keys else None,
    )
    logits = model(
        input_ids.view(batch, computed),
        logit_index=LogitIndex(candidate_grid.view(batch, per_row), real_entries if real else None),
        kv=frame,
    )
    for index, row in enumerate(rows):
        if row.computes_all and row.request.uses_kv_cache:
            # The block's first forward: its keys and values are the cache for the rest of the block.
            own = buffer[:, :, index, :, row.pad : row.pad + row.request.length]
            row.request.kv_cache_tensor = own if lone is not None else own.clone()  # a lone row's is the buffer
    return logits, candidate_cols


def propose_and_commit(
    requests: list, offsets: list[list[int]], logits: torch.Tensor, beside: torch.Tensor
) -> list[StepEvent | Exception]:
    """Each request's sampler step on its slice of the shared logits, for every kind of request.

    logits: [N, V] at every request's candidates, in order; beside: [N], what `propose` reads next to them (the
    candidates' canvas columns for LocalLeap's distances; for block diffusion, the tokens now there, for editing).
    A request whose step raises gets its exception back in its slot; the others are unaffected.
    """
    proposals: list[torch.Tensor | Exception] = []
    start = 0
    for request, row_offsets in zip(requests, offsets):
        end = start + len(row_offsets)
        try:
            proposals.append(request.propose(logits[start:end], beside[start:end]))
        except Exception as error:  # noqa: BLE001 - isolate one request's failure from its batch-mates
            proposals.append(error)
        start = end

    good = [p for p in proposals if not isinstance(p, Exception)]
    if good:
        # The one synchronisation of the step: every proposal comes to the host in a single copy.
        packed = torch.cat(good).tolist()
    events: list[StepEvent | Exception] = []
    at = 0
    for request, row_offsets, proposal in zip(requests, offsets, proposals):
        if isinstance(proposal, Exception):
            events.append(proposal)
            continue
        size = len(row_offsets)
        try:
            events.append(request.commit(row_offsets, packed[at : at + size]))
        except Exception as error:  # noqa: BLE001
            events.append(error)
        at += size
    return events
