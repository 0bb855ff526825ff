"""LLaDA in plain torch: a Llama-style decoder with bidirectional (non-causal) attention.

Module and parameter names mirror the official checkpoint (`model.transformer.blocks.0.q_proj.weight`, …)
so a state dict loads without renaming. The math follows the official remote code exactly (see
tests/fixtures/llada-tiny/README.md); the only additions are forward arguments that pad a batch or skip work:
- a key-padding mask for left-padded batches;
- `logit_index`, which computes only what the sampler needs: the 126k-row LM head, and the last block's
  queries, attention and MLP, run at the candidate positions only (the other positions still supply that
  block's keys and values);
- `real_tokens`, which runs the per-token work of a left-padded batch (norms, projections, MLP) on its real
  positions only: the trainer's batches, a sixth of whose positions are padding;
- `kv`, a `KVFrame`: the approximate KV cache (Fast-dLLM). The forward then computes only some positions of
  each row; the keys and values of the others come from the frame's buffer, where the fresh ones are written.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import LLaDAConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and scale in the model dtype, as the official code does (x · rsqrt(mean(x²) + ε),
        # here as one fused op).
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)


class RotaryCache:
    """cos/sin tables in float32 (LLaDA's `rope_full_precision`), grown on demand, one per device."""

    def __init__(self, head_dim: int, theta: float, initial_length: int):
        self.head_dim = head_dim
        self.theta = theta
        self.initial_length = initial_length
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._served: tuple[torch.Tensor, torch.Tensor] | None = None

    def get(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._served is not None:
            cos, sin = self._served
            if cos.shape[0] < length:
                raise RuntimeError(f"the served rotary tables hold {cos.shape[0]} positions; {length} were asked for")
            return cos[:length], sin[:length]
        cos, sin = self._tables.get(device, (None, None))
        if cos is None or cos.shape[0] < length:
            size = max(length, self.initial_length)
            exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
            inv_freq = 1.0 / (self.theta**exponent)
            angles = torch.outer(torch.arange(size, device=device, dtype=torch.float32), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            self._tables[device] = (cos, sin)
        return cos[:length], sin[:length]

    @torch.inference_mode()  # as the forwards build it: a table of another kind fails the compiled graphs' guards
    def fill(self, length: int, device: torch.device) -> None:
        """Build the table now, for `length` positions at least. The compiled forward needs this: a graph traced
        while the table is missing or too short builds it as a side effect and guards on the old one, so every
        graph compiled before recompiles at its next call."""
        self.get(length, device)

    def current(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole tables as they stand, grown first if they hold fewer than `length` positions."""
        self.get(length, device)
        return self._tables[device]

    @contextmanager
    def serving(self, cos: torch.Tensor, sin: torch.Tensor):
        """Within it, `get` slices these tables: an ahead-of-time graph (engine/aot_graphs.py) takes them as
        inputs rather than as tensors of the model frozen into it. They never grow: asking for more is an error."""
        self._served = (cos, sin)
        try:
            yield
        finally:
            self._served = None


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    t32 = t.float()
    return (t32 * cos + rotate_half(t32) * sin).to(t.dtype)


def rope_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The rotary table at `rows` [B, M] → [B, 1, M, head_dim]. `table` is shared by every row ([T, head_dim],
    indexed by canvas column) or already per row ([B, 1, A, head_dim], indexed by position in the row)."""
    if table.dim() == 2:
        return table[rows][:, None]
    return table.gather(2, rows[:, None, :, None].expand(-1, -1, -1, table.shape[-1]))


@dataclass(frozen=True)
class LogitIndex:
    """The positions whose logits a forward returns.

    columns: [B, M] canvas columns per row. A row with fewer than M wanted positions fills its tail with
        any of its other columns (they are computed, then dropped).
    real: flat indices into `columns.flatten()` of the wanted entries, in output order; None = all of them.

    A grid rather than a flat list because the last block runs its queries as a [B, M] batch. Build it on
    the host (engine/batch.py does), so that the forward needs no device-to-host synchronisation.
    """

    columns: torch.Tensor
    real: torch.Tensor | None = None

    @classmethod
    def from_mask(cls, wanted: torch.Tensor) -> LogitIndex:
        """From a [B, T] boolean mask; the output follows `wanted.nonzero()` order. Reads the mask on the host."""
        counts = wanted.sum(1)
        # A stable sort of "not wanted" puts each row's wanted columns first, in ascending order.
        order = torch.sort((~wanted).to(torch.uint8), dim=1, stable=True).indices
        columns = order[:, : int(counts.max())]
        is_real = torch.arange(columns.shape[1], device=wanted.device)[None, :] < counts[:, None]
        return cls(columns, None if bool(is_real.all()) else is_real.flatten().nonzero().squeeze(1))


@dataclass(frozen=True)
class RealTokens:
    """The real (not padding) positions of a left-padded [B, T] batch: `index` [N], flat indices into its B·T
    positions, ascending. Given to the forward, it runs the per-token work (embedding, norms, projections, MLP:
    most of a block's arithmetic) on those N positions only, and lays them out as [B, T] just for attention. A
    pad's output never reaches a real position (pads are hidden as keys), so each real position computes what
    it would in the padded batch. Build it on the host (`from_mask`), as the trainer's batches do."""

    index: torch.Tensor
    batch: int
    length: int

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> RealTokens:
        batch, length = attention_mask.shape
        return cls(attention_mask.flatten().nonzero().squeeze(1), batch, length)

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """[N, C] → [B, T, C], zeros at the pads."""
        padded = flat.new_zeros(self.batch * self.length, flat.shape[-1]).index_copy(0, self.index, flat)
        return padded.view(self.batch, self.length, -1)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, T, C] → [N, C]."""
        return padded.reshape(self.batch * self.length, -1).index_select(0, self.index)


@dataclass(frozen=True)
class KVFrame:
    """Keys and values for a forward that computes only some positions of each row (the approximate KV cache).

    buffer: [n_layers, 2, R, n_kv_heads, W, head_dim], contiguous: keys (after RoPE) and values. The frame is
        its first B rows (B = the batch) and first K key columns (`key_width`); in serving it is the
        preallocated pool of engine/kv_slots.py, whose row b is batch row b's cache. The forward writes the fresh
        keys and values of the columns it computes into it, in place, and attention reads all K columns.
    columns: [B, A] the key column of each computed position, i.e. of each entry of `input_ids`. A row with
        fewer than A positions points its filler entries at a column that `key_mask` hides.
    positions: [B, A] the rotary position of each computed entry: its place in its own canvas. A cached key
        then stays valid wherever its row sits.
    key_mask: [B, K], False on columns a row must not see (past its canvas, filler); None when every one of
        the K columns is a real key of every row.
    key_width: K; None → the mask's width, or the buffer's whole width W.
    first_row: the buffer row of batch row 0 (the frame is rows [first_row, first_row + B)).
    """

    buffer: torch.Tensor
    columns: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor | None = None
    key_width: int | None = None
    first_row: int = 0

    def layers(self) -> list[LayerKV]:
        """One `LayerKV` per layer. Each write is an `index_put_` on the whole buffer itself, indexed by
        (layer, key-or-value, row, head, column), and not on a view of it: torch.compile then keeps it in place.
        Through a view (a flat `.view(-1, head_dim)`, or a `scatter_` into a slice) inductor functionalizes the
        write into a clone of the whole buffer and a copy of it all back per call (measured on CPU, torch 2.13:
        docs/benchmarks.md, "Compiled forward"), so the compiled step would cost the pool's size."""
        n_layers, _, rows, heads, width, head_dim = self.buffer.shape
        batch = self.columns.shape[0]
        keys = self.key_width or (width if self.key_mask is None else self.key_mask.shape[1])
        device = self.columns.device
        row_index = torch.arange(self.first_row, self.first_row + batch, device=device)[:, None, None]  # [B, 1, 1]
        head_index = torch.arange(heads, device=device)[None, :, None]  # [1, H, 1]
        column_index = self.columns[:, None, :]  # [B, 1, A]
        layer_index, kind = torch.arange(n_layers, device=device), torch.arange(2, device=device)  # 0-d picks
        rows_used = slice(self.first_row, self.first_row + batch)
        return [
            LayerKV(
                self.buffer,
                (layer_index[layer], kind[0], row_index, head_index, column_index),
                (layer_index[layer], kind[1], row_index, head_index, column_index),
                self.buffer[layer, :, rows_used, :, :keys],
            )
            for layer in range(n_layers)
        ]


@dataclass(frozen=True)
class LayerKV:
    """One layer's view of a KVFrame."""

    buffer: torch.Tensor  # the frame's whole buffer
    key_index: tuple[torch.Tensor, ...]  # (layer, 0, rows [B,1,1], heads [1,H,1], columns [B,1,A]) → [B, H, A]
    value_index: tuple[torch.Tensor, ...]  # the same, with 1: the values' plane
    frame: torch.Tensor  # [2, B, n_kv_heads, K, head_dim]: what attention reads

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the fresh keys (rotated) and values [B, n_kv_heads, A, head_dim]; return every column's."""
        self.buffer.index_put_(self.key_index, k)
        self.buffer.index_put_(self.value_index, v)
        return self.frame[0], self.frame[1]


class LLaDABlock(nn.Module):
    def __init__(self, config: LLaDAConfig):
        super().__init__()
        d, hd = config.d_model, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)  # the SiLU-gated branch
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=False)

    def forward(
        self,
        x,
        cos,
        sin,
        key_mask,
        query_columns: torch.Tensor | None = None,
        kv: LayerKV | None = None,
        real: RealTokens | None = None,
        query_real: torch.Tensor | None = None,
    ):
        """x: [B, T, d] → [B, T, d]; or, with query_columns [B, M], the outputs at those rows only, [B, M, d]
        (with `query_real` as well, at its entries of that grid only, [N, d]).

        Every position attends to all (unpadded) positions, so all T positions supply keys and values, but a
        position's output depends only on its own query row: the rest of the block can skip the others.
        cos/sin: the rotary tables of x's rows ([T, head_dim] shared, or [B, 1, T, head_dim] per row).
        With `kv`, x holds only the positions the forward computes; the keys and values of every column come
        from kv's buffer, after the fresh ones (keys rotated like the queries) are written into it.
        With `real`, x is [N, d], the batch's real positions only (see RealTokens), and so is the output
        unless `query_columns` picks positions.
        """
        flat_queries = real is not None and query_columns is None  # every real position queries, as [N, d]
        n = self.attn_norm(x)
        k, v = self.k_proj(n), self.v_proj(n)
        if real is not None:  # keys and values, and the queries below, are laid out as [B, T] for attention
            k, v = real.pad(k), real.pad(v)
        batch, length, _ = k.shape
        k = k.view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        if kv is not None:
            k, v = kv.write(k, v)
        if query_columns is not None:
            if real is not None:
                x, n = real.pad(x), real.pad(n)
            gather = query_columns[..., None].expand(-1, -1, x.shape[-1])
            x, n = x.gather(1, gather), n.gather(1, gather)
            cos, sin = rope_rows(cos, query_columns), rope_rows(sin, query_columns)  # [B, 1, M, head_dim]
        q = self.q_proj(n)
        if flat_queries:
            q = real.pad(q)
        queries = q.shape[1]
        q = apply_rope(q.view(batch, queries, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, is_causal=False, enable_gqa=self.n_kv_heads != self.n_heads
        )
        attn = attn.transpose(1, 2).reshape(batch, queries, -1)
        if query_real is not None:  # the MLP runs at the wanted entries of the grid only
            x, attn = x.flatten(0, 1)[query_real], attn.flatten(0, 1)[query_real]
        elif flat_queries:
            attn = real.unpad(attn)
        h = x + self.attn_out(attn)
        n = self.ff_norm(h)
        return h + self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n))


class LLaDAModelLM(nn.Module):
    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.d_model),
                "blocks": nn.ModuleList(LLaDABlock(config) for _ in range(config.n_layers)),
                "ln_f": RMSNorm(config.d_model, config.rms_norm_eps),
                "ff_out": nn.Linear(config.d_model, config.vocab_size, bias=False),
            }
        )
        self.rotary = RotaryCache(config.head_dim, config.rope_theta, config.max_sequence_length)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        logit_index: LogitIndex | None = None,
        kv: KVFrame | None = None,
        real_tokens: RealTokens | None = None,
    ) -> torch.Tensor:
        """Logits of a [B, T] batch.

        attention_mask: [B, T], 1 for real tokens and 0 for (left) padding; pads are hidden as keys only.
            Pass None when the batch has no padding: SDPA then picks its fastest kernel.
        logit_index: the positions whose logits are wanted → returns [N, V] (N = its real entries);
            None → logits everywhere, [B, T, V].
        kv: compute only the positions `kv.columns` ([B, A], the tokens of `input_ids`), reading and writing
            keys and values in `kv.buffer` (see KVFrame); `attention_mask` is then `kv.key_mask`'s job and
            `logit_index` counts positions within each row of `input_ids`.
        real_tokens: `attention_mask`'s real positions (`RealTokens.from_mask`, built on the host): the blocks'
            per-token work skips the pads. Without `logit_index` the logits are then those positions', [N, V].
            Not with `kv`, whose forward computes only some positions already.
        """
        if real_tokens is not None and kv is not None:
            raise ValueError("real_tokens and kv cannot be combined")
        t = self.model.transformer
        x = t.wte(input_ids if real_tokens is None else input_ids.flatten().index_select(0, real_tokens.index))
        layers: list[LayerKV | None] = [None] * len(t.blocks)
        if kv is None:
            cos, sin = self.rotary.get(input_ids.shape[1], input_ids.device)
            key_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        else:
            cos, sin = self.rotary.get(int(kv.buffer.shape[-2]), input_ids.device)  # positions < key columns
            cos, sin = rope_rows(cos, kv.positions), rope_rows(sin, kv.positions)
            key_mask = None if kv.key_mask is None else kv.key_mask[:, None, None, :]
            layers = kv.layers()
        *blocks, last = t.blocks
        for block, layer_kv in zip(blocks, layers):
            x = block(x, cos, sin, key_mask, kv=layer_kv, real=real_tokens)
        if logit_index is None:
            return t.ff_out(t.ln_f(last(x, cos, sin, key_mask, kv=layers[-1], real=real_tokens)))
        x = last(
            x,
            cos,
            sin,
            key_mask,
            query_columns=logit_index.columns,
            kv=layers[-1],
            real=real_tokens,
            query_real=logit_index.real,
        )
        return t.ff_out(t.ln_f(x.reshape(-1, x.shape[-1])))  # [B, M, d] or, with real entries picked, [N, d]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def kv_bytes(self, positions: int) -> int:
        """Bytes of a KV cache holding `positions` columns (keys and values of every layer)."""
        c = self.config
        element = self.model.transformer.wte.weight.element_size()
        return c.n_layers * 2 * c.n_kv_heads * c.head_dim * positions * element
