"""Dream (Dream-v0-Instruct-7B, DiffuCoder-7B) in plain torch: Qwen2 with bidirectional attention.

Module and parameter names mirror the official checkpoint (`model.layers.0.self_attn.q_proj.bias`, …) so
a state dict loads without renaming. The math follows the official `modeling_dream.py` (see
tests/fixtures/dream-tiny/README.md): Qwen2's grouped-query attention with biases on q/k/v, RMSNorm,
rotate-half RoPE and a SwiGLU MLP, with attention that is not causal. Norm, RoPE and attention code is
shared with the LLaDA model (engine/model.py): the two differ in names, biases and the two points below.

**Shifted logits.** Dream was trained from an autoregressive model and kept its output alignment: the
hidden state at position i predicts token i + 1. The sampler asks for the logits *of* its candidate
columns, so with a `logit_index` this model runs its last layer and LM head at `columns - 1`; the batch
code needs no family-specific step. A candidate is never the first column (a prompt has at least one
token), so `columns - 1` is always a real position of the same row.

**The approximate KV cache** (Fast-dLLM, `kv`): the same `KVFrame` as the LLaDA model's, and the same batch
code (engine/batch.py). The keys are cached after RoPE, where Fast-dLLM's Dream caches them before it and rotates
the whole key set at every forward: the same keys, since a key's rotation depends only on its position. The
shift is why a cached block's first position is decided by the block's full forward (engine/dream_cache.py).

**Positions restart at every row's first real token.** With left padding, the official sampler gives
position `cumsum(mask) - 1`, so a padded row sees exactly the rotary angles it would see alone. LLaDA's
official code numbers padded positions too; here the padded row is made to match Dream's own batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import DreamConfig
from engine.model import KVFrame, LayerKV, LogitIndex, RMSNorm, RotaryCache, apply_rope, rope_rows

# Rotary tables are built for this many positions up front and grown on demand: Dream declares 131072
# positions, and tables that long would take 134 MB for nothing.
_INITIAL_ROTARY_LENGTH = 4096


class DreamAttention(nn.Module):
    def __init__(self, config: DreamConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, keys_from, queries_from, rope, query_rope, key_mask, kv: LayerKV | None = None):
        """keys_from: [B, T, d] (every position); queries_from: [B, M, d]; rope: cos/sin [B|1, 1, T, hd].
        With `kv`, keys_from holds only the positions the forward computes: their keys (rotated) and values are
        written into kv's buffer, and attention reads every column of it."""
        batch, length, _ = keys_from.shape
        k = self.k_proj(keys_from).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(keys_from).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k = apply_rope(k, *rope)
        if kv is not None:
            k, v = kv.write(k, v)
        queries = queries_from.shape[1]
        q = self.q_proj(queries_from).view(batch, queries, self.n_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, *query_rope)
        # Query head h reads key/value head h // (n_heads / n_kv_heads), as Qwen2's repeat_kv arranges them.
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, is_causal=False, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.o_proj(attn.transpose(1, 2).reshape(batch, queries, -1))


class DreamMLP(nn.Module):
    def __init__(self, config: DreamConfig):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(nn.Module):
    def __init__(self, config: DreamConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DreamAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DreamMLP(config)

    def forward(self, x, rope, key_mask, queries: tuple[torch.Tensor, tuple] | None = None, kv: LayerKV | None = None):
        """x: [B, T, d] → [B, T, d]; or, with queries = (columns [B, M], their cos/sin), the outputs at those
        columns only, [B, M, d]: every position supplies keys and values, but a position's output depends
        only on its own query row (the same pruning as the LLaDA model's last block)."""
        n = self.input_layernorm(x)
        query_rope = rope
        if queries is not None:
            columns, query_rope = queries
            gather = columns[..., None].expand(-1, -1, x.shape[-1])
            x, n_queries = x.gather(1, gather), n.gather(1, gather)
        else:
            n_queries = n
        h = x + self.self_attn(n, n_queries, rope, query_rope, key_mask, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


class DreamModelLM(nn.Module):
    def __init__(self, config: DreamConfig):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(DreamDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        initial = min(config.max_sequence_length, _INITIAL_ROTARY_LENGTH)
        self.rotary = RotaryCache(config.head_dim, config.rope_theta, initial)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        logit_index: LogitIndex | None = None,
        kv: KVFrame | None = None,
    ) -> torch.Tensor:
        """Logits of a [B, T] batch.

        attention_mask: [B, T], 1 for real tokens and 0 for (left) padding; pads are hidden as keys, and
            each row's positions count from its first real token. None when the batch has no padding.
        logit_index: the columns whose tokens are wanted → [N, V], the predictions *for* those columns
            (computed at the column before each); None → the model's raw output [B, T, V], where row i
            predicts token i + 1 (what the official `DreamModel.forward` returns).
        kv: compute only the positions `kv.columns` ([B, A], the tokens of `input_ids`), reading and writing
            keys and values in `kv.buffer` (see KVFrame); `attention_mask` is then `kv.key_mask`'s job and
            `logit_index` counts positions within each row of `input_ids`, the shift included: the column
            before a wanted one must be computed too.
        """
        length = input_ids.shape[1]
        layers_kv: list[LayerKV | None] = [None] * len(self.model.layers)
        if kv is not None:
            positions, key_mask = kv.positions, None if kv.key_mask is None else kv.key_mask[:, None, None, :]
            cos, sin = self.rotary.get(int(kv.buffer.shape[-2]), input_ids.device)  # positions < key columns
            layers_kv = kv.layers()
        elif attention_mask is None:
            positions = torch.arange(length, device=input_ids.device)[None]  # [1, T]
            key_mask = None
        else:
            # Pads get position 0; they are never attended to, and their own outputs are never read.
            positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)  # [B, T]
            key_mask = attention_mask.bool()[:, None, None, :]
        if kv is None:
            cos, sin = self.rotary.get(length, input_ids.device)
        rope = (rope_rows(cos, positions), rope_rows(sin, positions))  # [B|1, 1, T, hd]

        x = self.model.embed_tokens(input_ids)
        *layers, last = self.model.layers
        for layer, layer_kv in zip(layers, layers_kv):
            x = layer(x, rope, key_mask, kv=layer_kv)
        if logit_index is None:
            return self.lm_head(self.model.norm(last(x, rope, key_mask, kv=layers_kv[-1])))
        # Shifted logits: column c is predicted at c − 1. Only a filler entry of the grid can be column 0
        # (a candidate always follows a prompt, or in a cached forward the block's first position, which is
        # never a candidate there); clamping keeps it a valid column, and it is dropped anyway.
        columns = (logit_index.columns - 1).clamp(min=0)
        query_positions = positions.expand(input_ids.shape[0], -1).gather(1, columns)
        query_rope = (rope_rows(cos, query_positions), rope_rows(sin, query_positions))  # [B, 1, M, hd]
        x = last(x, rope, key_mask, queries=(columns, query_rope), kv=layers_kv[-1]).flatten(0, 1)
        if logit_index.real is not None:
            x = x[logit_index.real]
        return self.lm_head(self.model.norm(x))

    def kv_bytes(self, positions: int) -> int:
        """Bytes of a KV cache holding `positions` columns (keys and values of every layer)."""
        c = self.config
        element = self.model.embed_tokens.weight.element_size()
        return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * positions * element

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
