"""One denoising step for a batch of block-diffusion requests (LLaDA2): one forward over their spans, exact cache.

Each request computes only its `forward_span()` (the current block, plus the block just finished at a block's
first forward); every earlier position's keys and values come from the request's own cache. Positions are the
canvas positions themselves: the frame's column c holds position c of every row, so nothing is shifted by
padding and a cached key is valid at every step.

- A lone request runs against its own cache: the frame's buffer is a view of it (the first `end` columns), the
  fresh keys and values are written into it in place, and no cache is copied.
- Several requests share one forward: a zeroed buffer as wide as the widest row holds each row's cached
  columns, the forward writes the fresh ones, and each row's fresh span is copied back to its cache. Rows
  with shorter spans fill up with entries aimed at one extra column that no query sees. The attention mask
  (`visible`) is block-causal per row (its own block length) and hides every column at or past the row's end,
  so padding never changes a real row's keys, queries or logits.

The host waits on the device once per step for the sampler, when the proposals of all rows come back in one
small tensor (the MoE layers also read their per-expert token counts: engine/llada2.py).
"""

from __future__ import annotations

from itertools import chain

import torch

from engine.batch import _candidate_grid, _to_device, propose_and_commit
from engine.block_sampler import BlockDiffusionRequest
from engine.llada2 import BlockKVFrame, LLaDA2MoeModelLM
from engine.model import LogitIndex
from engine.sampler import StepEvent


@torch.inference_mode()
def block_denoise_step(
    model: LLaDA2MoeModelLM, requests: list[BlockDiffusionRequest], device: torch.device, pad_id: int
) -> list[StepEvent | Exception]:
    """Advance every request by one forward. A request whose sampler step raises gets its exception back in its
    slot; a failing forward raises (it concerns the whole batch)."""
    spans = [r.forward_span() for r in requests]
    offsets = [r.candidate_offsets() for r in requests]
    for request in requests:
        if request.kv_cache_tensor is None:
            request.kv_cache_tensor = model.new_kv_buffer(1, request.length)[:, :, 0]
    batch = len(requests)
    computed = max(end - start for start, end in spans)
    ragged = any(end - start != computed for start, end in spans)
    width = max(end for _, end in spans) + ragged  # the filler column is the last one
    filler = width - 1

    # Host side, one list: ids, buffer columns (= canvas positions), visibility limits, candidate grid.
    ids, columns, limits, candidates = [], [], [], []
    needs_mask = batch > 1
    for request, (start, end), row_offsets in zip(requests, spans, offsets):
        block, fill = request.params.block_length, computed - (end - start)
        ids += request.canvas_slice(start, end) + [pad_id] * fill
        columns += list(range(start, end)) + [filler] * fill
        # A query sees the keys of its block and the earlier ones: columns below its block's end.
        limits += [(position // block + 1) * block for position in range(start, end)] + [1] * fill
        needs_mask |= end - start > block  # a finished block in the span must not see the current one
        candidates.append([request.prompt_length + offset - start for offset in row_offsets])
    grid, real, per_row = _candidate_grid(candidates)
    sections = [ids, columns, limits, grid, real]
    on_device = _to_device(list(chain(*sections)), device).split([len(s) for s in sections])
    input_ids, column_t, limit_t, grid_t, real_t = on_device
    input_ids, column_t = input_ids.view(batch, computed), column_t.view(batch, computed)

    if batch == 1:
        start, end = spans[0]
        buffer = requests[0].kv_cache_tensor[:, :, None, :, :end]  # a view: the forward writes the cache itself
    else:
        buffer = model.new_kv_buffer(batch, width)
        for row, (request, (start, _)) in enumerate(zip(requests, spans)):
            buffer[:, :, row, :, :start] = request.kv_cache_tensor[:, :, :, :start]
    visible = None
    if needs_mask:
        key_columns = torch.arange(buffer.shape[-2], device=device)
        visible = (key_columns[None, None, :] < limit_t.view(batch, computed)[:, :, None])[:, None]
    frame = BlockKVFrame(buffer, column_t, column_t, visible)
    index = LogitIndex(grid_t.view(batch, per_row), real_t if real else None)
    logits = model(input_ids, kv=frame, logit_index=index)
    if batch > 1:
        for row, (request, (start, end)) in enumerate(zip(requests, spans)):
            request.kv_cache_tensor[:, :, :, start:end] = buffer[:, :, row, :, start:end]
    current = input_ids.gather(1, index.columns).flatten()
    if index.real is not None:
        current = current[index.real]
    return propose_and_commit(requests, offsets, logits, current)
