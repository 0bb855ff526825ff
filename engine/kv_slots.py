"""Preallocated KV-cache slots: one pool tensor whose rows are the cached requests' caches, written in place.

The pool is [n_layers, 2, rows, n_kv_heads, width, head_dim] (keys after RoPE, and values). One implementation
serves every cache: a request that uses the approximate KV cache of LLaDA or Dream (kv_cache "prefix" or
"dual", engine/batch.py) or the exact block cache of LLaDA2 (engine/block_step.py) takes a row at its first
cached forward and gives it back when it ends or is cancelled; the row's column c holds canvas position c of
that request (no left padding), so a cached key is valid wherever the request sits in a batch. A model holds
one family, so one pool holds one kind of cache.

Why one pool instead of one tensor per request: a step's forward reads and writes the pool itself (`KVFrame`,
or LLaDA2's `BlockKVFrame`, over the rows the batch occupies), so a batched step copies no request's cache
into a batch buffer, and no buffer is allocated or zero-filled per step. The pool only grows at admission
(more rows or more columns, rounded up, the live rows copied once) and is freed when the last cached request
leaves — unless a warm-up reserved its size, so that the compiled graphs, which are specialised on the
pool's shape, stay valid.

Rows are kept compact: when a request leaves, the request in the highest row moves into its row (one copy
of one cache, at release, never per step), so the live rows are always rows [0, live) and a step's frame is
a run of them (a live row inside the run that the step leaves out runs as a dummy that changes nothing).
Unused columns and rows hold finite values (the pool starts zeroed, then only finite keys are written),
which matters because attention reads them before its mask drops them: a NaN would survive the mask.

One column beyond every live request's canvas is always there (`width` ≥ longest canvas + 1): it is the
filler column that shorter rows aim their spare entries at; no real query ever sees it.
"""

from __future__ import annotations

import torch

# Columns are allocated in multiples of this (fewer distinct widths, so fewer reallocations and shapes).
WIDTH_QUANTUM = 64


def round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


def row_bucket(rows: int) -> int:
    """Rows are allocated in powers of two (1, 2, 4, 8, ...)."""
    return 1 << max(rows - 1, 0).bit_length()


class KVSlots:
    """The pool of one model; `acquire` / `release` are called on the scheduler thread (or the caller's, when
    requests are stepped directly): it takes no lock."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.layout = (n_layers, n_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.pool: torch.Tensor | None = None
        self.owners: list = []  # the request in each live row, row order
        self.reserved = (0, 0)  # (rows, width) a warm-up asked to keep allocated

    @property
    def rows(self) -> int:
        return 0 if self.pool is None else self.pool.shape[2]

    @property
    def width(self) -> int:
        return 0 if self.pool is None else self.pool.shape[4]

    @property
    def live(self) -> int:
        return len(self.owners)

    def pool_bytes(self) -> int:
        return 0 if self.pool is None else self.pool.numel() * self.pool.element_size()

    def reserve(self, rows: int, width: int) -> None:
        """Allocate at least `rows` × `width` now and keep it while no request is live (warm-up: the compiled
        graphs are specialised on the pool's shape)."""
        self.reserved = (max(self.reserved[0], rows), max(self.reserved[1], width))
        self._ensure(rows, width)

    def ensure(self, rows: int, canvas: int) -> None:
        """Room for `rows` live rows and canvases of `canvas` positions (plus the filler column)."""
        self._ensure(rows, canvas + 1)

    @torch.inference_mode()  # the pool is an inference tensor (the forwards run in inference mode)
    def _ensure(self, rows: int, width: int) -> None:
        if rows <= self.rows and width <= self.width:
            return
        n_layers, n_kv_heads, head_dim = self.layout
        rows, width = row_bucket(max(rows, self.rows)), round_up(max(width, self.width), WIDTH_QUANTUM)
        shape = (n_layers, 2, rows, n_kv_heads, width, head_dim)
        pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.pool is not None and self.live:
            pool[:, :, : self.live, :, : self.width] = self.pool[:, :, : self.live]
        self.pool = pool

    def acquire(self, request) -> int:
        """Give `request` the next row (room for its canvas included); returns the row."""
        self.ensure(self.live + 1, max([request.length, *(owner.length for owner in self.owners)]))
        self.owners.append(request)
        request.kv_slot = self
        return self.live - 1

    def row_of(self, request) -> int:
        return self.owners.index(request)

    def view(self, request) -> torch.Tensor:
        """The request's cache: [n_layers, 2, n_kv_heads, its canvas length, head_dim], a view of the pool."""
        return self.pool[:, :, self.row_of(request), :, : request.length]

    @torch.inference_mode()
    def release(self, request) -> None:
        """Free the request's row; the highest row moves into it so the live rows stay [0, live)."""
        row = self.row_of(request)
        last = self.live - 1
        if row != last:
            self.pool[:, :, row] = self.pool[:, :, last]
            self.owners[row] = self.owners[last]
        self.owners.pop()
        request.kv_slot = None
        if not self.owners and self.reserved == (0, 0):
            self.pool = None  # nothing cached: give the memory back


def kv_slots(model) -> KVSlots:
    """The model's pool, created on first use (on the model's device, in its dtype)."""
    slots = getattr(model, "_kv_slots", None)
    if slots is None:
        c, weight = model.config, _embedding(model.model).weight  # never quantized: the cache's dtype
        layers = getattr(c, "n_layers", None) or c.num_hidden_layers  # LLaDA's names, or HF's (Dream, LLaDA2)
        kv_heads = getattr(c, "n_kv_heads", None) or c.num_key_value_heads
        slots = KVSlots(layers, kv_heads, c.head_dim, weight.dtype, weight.device)
        object.__setattr__(model, "_kv_slots", slots)  # plain attribute, not a submodule or buffer
    return slots


def _embedding(inner) -> torch.nn.Embedding:
    """The token embedding of a model's trunk, under each family's checkpoint name."""
    if hasattr(inner, "transformer"):
        return inner.transformer.wte  # LLaDA
    return inner.embed_tokens if hasattr(inner, "embed_tokens") else inner.word_embeddings  # Dream / LLaDA2
