"""One denoising step for a batch of requests: one left-padded forward, then each request's own sampler step.

Requests of any prompt length, canvas size and sampling settings can share the forward: rows are
left-padded (RoPE depends only on relative offsets, so a padded row computes the same logits), and the
last block and the LM head run only at each request's candidate positions. The host waits on the device
exactly once per step, when the proposals (one small tensor for the whole batch) come back.

Requests with a KV cache (kv_cache "prefix" or "dual") compute only part of their canvas after a block's
first forward. A batch holding one runs as a `KVFrame` forward over the model's preallocated KV pool
(engine/kv_slots.py): each request's row of the pool is its cache, the forward reads it and writes the fresh
keys and values into it in place, and each row computes its own `forward_span()` (a row with a shorter span
fills up with entries aimed at a "filler" key column that no query reads). No cache is copied per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from engine.block_sampler import BlockDiffusionRequest
from engine.compiled import compiled_forward_for
from engine.kv_slots import kv_slots
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
    family, so a batch is all of one kind. A request that has already finished gets a ValueError back and is
    not stepped: it has given its KV-pool row back, and a step would take one that nothing frees.
    """
    if any(r.finished for r in requests):
        unfinished = [r for r in requests if not r.finished]
        live = iter(denoise_step(model, unfinished, device, pad_id) if unfinished else [])
        return [ValueError("this request has already finished") if r.finished else next(live) for r in requests]
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
    """Every row computes its whole (left-padded) canvas: the reference path.

    With a compiled model (engine/compiled.py) a short canvas is padded into its bucket: more left padding,
    dummy rows (pads that see only their last column) and a wider candidate grid; the padding stays hidden.
    """
    static = compiled_forward_for(model, width)
    batch, dummies = len(rows), 0
    if static is not None:
        width = static.length(width)
        dummies = static.batch(batch) - batch
    padded = static is not None or any(row.request.length != width for row in rows)
    # The step's inputs, host side: canvases, then the candidates' canvas columns (the grid's filler is the
    # row's last candidate column), then the same columns as a flat list.
    ids, mask, columns = [], [], []
    for row in rows:
        request = row.request
        pad = width - request.length
        ids += [pad_id] * pad
        ids += request.prompt_ids
        ids += request.generated
        if padded:
            mask += [0] * pad + [1] * request.length
        columns.append([offset + pad + request.prompt_length for offset in row.offsets])
    for _ in range(dummies):
        ids += [pad_id] * width
        mask += [0] * (width - 1) + [1]
        columns.append([width - 1])
    grid, real, per_row = _candidate_grid(columns)
    if static is not None:
        grid, real, per_row = _widened_grid(columns, static.candidates(per_row, width), len(rows))
    rows_total = batch + dummies
    sections = [ids, mask, grid, real, list(chain(*columns[:batch]))]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, attention_mask, candidate_grid, real_entries, candidate_cols = on_device
    input_ids = input_ids.view(rows_total, width)
    attention_mask = attention_mask.view(rows_total, width) if padded else None
    index = LogitIndex(candidate_grid.view(rows_total, per_row), real_entries if real else None)
    if static is not None:
        return static(model, input_ids, attention_mask, index, None), candidate_cols
    return model(input_ids, attention_mask, logit_index=index), candidate_cols


def _widened_grid(columns: list[list[int]], per_row: int, real_rows: int) -> tuple[list[int], list[int], int]:
    """`_candidate_grid` at a bucketed width `per_row`, keeping the candidates of the first `real_rows` rows."""
    grid, real = [], []
    for row, row_cols in enumerate(columns):
        grid += row_cols + [row_cols[-1]] * (per_row - len(row_cols))
        if row < real_rows:
            real += range(row * per_row, row * per_row + len(row_cols))
    return grid, real, per_row


def _cached_forward(model, rows: list[_Row], width: int, device, pad_id: int):
    """Each row computes its forward span, against the model's KV pool (engine/kv_slots.py), in place.

    Every request has a row of the pool: a cached one from its first cached forward to its end, an uncached
    one that shares this step with cached ones for this step only. The frame is the pool's rows from the
    lowest to the highest of the batch; a row in between that is not stepped now (the batching policy left it
    out) runs as a dummy: its entries aim at the pool's last column, which no real query reads, and it sees
    only its column 0, so it computes finite garbage and changes nothing.
    """
    del width  # the pool's columns are canvas positions: nothing is left-padded
    computed = max(row.end - row.start for row in rows)
    static = compiled_forward_for(model, computed)
    slots = kv_slots(model)
    requests = [row.request for row in rows]
    temporary = []
    for request in sorted(requests, key=lambda r: not r.uses_kv_cache):  # this step's rows on top
        if request.kv_slot is None:
            slots.acquire(request)
            if not request.uses_kv_cache:
                temporary.append(request)
    pool_rows = [slots.row_of(request) for request in requests]
    first_row = min(pool_rows)
    batch = max(pool_rows) - first_row + 1
    if static is not None:  # the bucket: the pool's first rows, lengths rounded up
        first_row, batch = 0, static.batch(max(pool_rows) + 1)
        slots.ensure(batch, slots.width - 1)
    frame_row = {id(request): row - first_row for request, row in zip(requests, pool_rows)}
    by_frame_row: list[_Row | None] = [None] * batch
    for row in rows:
        by_frame_row[frame_row[id(row.request)]] = row
    key_width = max(request.length for request in requests)
    if static is not None:
        computed, key_width = static.length(computed), static.key_window(key_width, slots.width)
    filler_column = slots.width - 1  # past every canvas (hidden if inside the key window): written, never seen
    # The compiled graph always takes a mask: its width is how the graph learns the key window.
    hide_keys = static is not None or batch > len(rows) or any(request.length < key_width for request in requests)

    ids, columns_of_computed, positions, key_mask, candidates = [], [], [], [], []
    for row in by_frame_row:
        if row is None:  # a dummy
            ids += [pad_id] * computed
            columns_of_computed += [filler_column] * computed
            positions += [0] * computed
            key_mask += [1] + [0] * (key_width - 1)
            candidates.append([0])
            continue
        request, fill = row.request, computed - (row.end - row.start)
        canvas = request.prompt_ids + request.generated
        ids += canvas[row.start : row.end] + [pad_id] * fill
        columns_of_computed += [*range(row.start, row.end), *[filler_column] * fill]
        positions += [*range(row.start, row.end), *[0] * fill]
        if hide_keys:
            key_mask += [1] * request.length + [0] * (key_width - request.length)
        # The logits are wanted at the candidates, counted within the row's computed span.
        candidates.append([request.prompt_length + offset - row.start for offset in row.offsets])
    grid, _, per_row = _candidate_grid(candidates)
    if static is not None:
        grid, _, per_row = _widened_grid(candidates, static.candidates(per_row, computed), 0)
    real = [
        frame_row[id(row.request)] * per_row + k for row in rows for k in range(len(row.offsets))
    ]  # the requests' candidates, in the requests' order
    if real == list(range(batch * per_row)):
        real = []
    # LocalLeap reads distances only: a candidate's canvas position serves.
    cols = [row.request.prompt_length + offset for row in rows for offset in row.offsets]
    sections = [ids, columns_of_computed, positions, key_mask, grid, real, cols]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, computed_columns, computed_positions, key_mask_t, candidate_grid, real_entries, candidate_cols = (
        on_device
    )
    frame = KVFrame(
        slots.pool,
        computed_columns.view(batch, computed),
        computed_positions.view(batch, computed),
        key_mask_t.view(batch, key_width).bool() if hide_keys else None,
        key_width=key_width,
        first_row=first_row,
    )
    index = LogitIndex(candidate_grid.view(batch, per_row), real_entries if real else None)
    try:
        if static is not None:
            logits = static(model, input_ids.view(batch, computed), None, index, frame)
        else:
            logits = model(input_ids.view(batch, computed), logit_index=index, kv=frame)
    finally:
        for request in reversed(temporary):  # the top rows, highest first: nothing moves
            slots.release(request)
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
