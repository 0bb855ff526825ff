"""One denoising step for a batch of block-diffusion requests (LLaDA2): one forward over their spans, exact cache.

Each request computes only its `forward_span()` (the current block, plus the block just finished at a block's
first forward); every earlier position's keys and values come from its cache. The caches are rows of the
model's preallocated KV pool (engine/kv_slots.py, shared with the approximate caches' code): a request takes a
row at its first forward and gives it back when it ends or is cancelled. Column c of a row holds canvas
position c, so positions are the canvas positions themselves and a cached key is valid at every step.

The forward's `BlockKVFrame` is the pool itself, narrowed to the rows from the lowest to the highest that the
batch occupies and to the first K key columns (K = the furthest span end). The forward writes the fresh keys
and values into the rows in place: no cache is copied in or out and no buffer is allocated per step, for a
lone request (batch 1) as for a batch.

- A row with a shorter span fills up with entries aimed at the pool's last column (past every canvas, and
  outside the K columns attention reads), so filler never lands on a real key and no query ever sees it.
- A live row between the batch's rows that is not stepped now (the batching policy left it out) runs as a
  dummy: all its entries write that same last column and see only its column 0, so it changes nothing.
- The attention mask (`visible`) is block-causal per row (its own block length) and hides every column at or
  past the row's span end (the pool is wider than a row, and its later columns hold nothing of this row
  yet), so padding never changes a real row's keys, queries or logits.

The host waits on the device once per step for the sampler, when the proposals of all rows come back in one
small tensor (the MoE layers also read their per-expert token counts: engine/llada2.py).
"""

from __future__ import annotations

from itertools import chain

import torch

from engine.batch import _candidate_grid, _to_device, propose_and_commit
from engine.block_sampler import BlockDiffusionRequest
from engine.kv_slots import kv_slots
from engine.llada2 import BlockKVFrame, LLaDA2MoeModelLM
from engine.model import LogitIndex
from engine.sampler import StepEvent


@torch.inference_mode()
def block_denoise_step(
    model: LLaDA2MoeModelLM, requests: list[BlockDiffusionRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one forward. A request whose sampler step raises gets its exception back in its
    slot; a failing forward raises (it concerns the whole batch)."""
    slots = kv_slots(model)
    for request in requests:
        if request.kv_slot is None:  # its first forward: it keeps this row until it ends
            slots.acquire(request)
    pool_rows = [slots.row_of(request) for request in requests]
    first_row = min(pool_rows)
    batch = max(pool_rows) - first_row + 1
    frame_rows: list[int | None] = [None] * batch  # the index in `requests` of each frame row; None: not stepped
    for i, row in enumerate(pool_rows):
        frame_rows[row - first_row] = i
    spans = [r.forward_span() for r in requests]
    offsets = [r.candidate_offsets() for r in requests]
    computed = max(end - start for start, end in spans)
    key_width = max(end for _, end in spans)
    filler = slots.width - 1  # past every canvas and outside the key window: written, never read

    # Host side, one list: ids, pool columns (= canvas positions), visibility limits, candidate grid.
    ids, columns, limits, candidates = [], [], [], []
    needs_mask = batch > 1
    for i in frame_rows:
        if i is None:  # a dummy: writes only the filler column, sees only its own column 0
            ids += [pad_id] * computed
            columns += [filler] * computed
            limits += [1] * computed
            candidates.append([0])
            continue
        request, (start, end) = requests[i], spans[i]
        block, fill = request.params.block_length, computed - (end - start)
        ids += request.canvas_slice(start, end) + [pad_id] * fill
        columns += list(range(start, end)) + [filler] * fill
        # A query sees the keys of its block and the earlier ones: columns below its block's end, never past the
        # row's span (the pool's later columns hold another request's old keys, or nothing yet).
        limits += [(position // block + 1) * block for position in range(start, end)] + [1] * fill
        needs_mask |= end - start > block  # a finished block in the span must not see the current one
        candidates.append([request.prompt_length + offset - start for offset in offsets[i]])
    grid, _, per_row = _candidate_grid(candidates)
    real = [  # the stepped requests' candidates, in the requests' order
        (row - first_row) * per_row + k for row, row_offsets in zip(pool_rows, offsets) for k in range(len(row_offsets))
    ]
    if real == list(range(batch * per_row)):
        real = []  # every grid entry is one, already in order
    sections = [ids, columns, limits, grid, real]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, column_t, limit_t, grid_t, real_t = on_device
    input_ids, column_t = input_ids.view(batch, computed), column_t.view(batch, computed)

    visible = None
    if needs_mask:
        key_columns = torch.arange(key_width, device=device)
        visible = (key_columns[None, None, :] < limit_t.view(batch, computed)[:, :, None])[:, None]
    frame = BlockKVFrame(slots.pool, column_t, column_t, visible, key_width=key_width, first_row=first_row)
    index = LogitIndex(grid_t.view(batch, per_row), real_t if real else None)
    logits = model(input_ids, kv=frame, logit_index=index)
    current = input_ids.gather(1, index.columns).flatten()
    if index.real is not None:
        current = current[index.real]
    return propose_and_commit(requests, offsets, logits, current)
