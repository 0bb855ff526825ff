"""LLaDA2.x (`llada2_moe`: LLaDA2.0 / LLaDA2.1, mini and flash) in plain torch.

Module and parameter names mirror the official checkpoint (`model.layers.1.attention.query_key_value.weight`,
`model.layers.1.mlp.experts.3.up_proj.weight`, `model.layers.1.mlp.gate.expert_bias`, …) so a state dict loads
without renaming. The math follows the official `modeling_llada2_moe.py` (tests/fixtures/llada2-tiny/README.md,
section 4):
- attention: one fused q/k/v projection split into H query, K key and K value heads; per-head RMSNorm on q
  and k, then RoPE on the first `rotary_dim` dimensions of each head only; grouped-query attention;
- MLP: a dense SwiGLU in the first `first_k_dense_replace` layers, a mixture of experts after that: sigmoid
  router, group-limited top-k on scores plus `expert_bias` (the bias only selects), mixing weights from the
  unbiased scores, normalised and scaled by `routed_scaling_factor`, plus a shared SwiGLU expert.

Attention is block-causal (a query sees the keys of its own block and of earlier ones), so the keys and
values of the prompt and of every finished block never change: the forward takes a `BlockKVFrame` that
holds them and computes only the positions it is given (engine/block_sampler.py, engine/block_step.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import LLaDA2Config
from engine.model import LogitIndex, RMSNorm, RotaryCache, rope_rows, rotate_half


def apply_partial_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dimensions of each head (rotate-half style); the rest pass through."""
    rotary = cos.shape[-1]
    rot, rest = t[..., :rotary], t[..., rotary:]
    rot32 = rot.float()
    rotated = (rot32 * cos + rotate_half(rot32) * sin).to(t.dtype)
    return torch.cat((rotated, rest), dim=-1)


@dataclass(frozen=True)
class BlockKVFrame:
    """Keys and values for a forward that computes only some positions of each row (the exact block cache).

    buffer: [n_layers, 2, R, n_kv_heads, W, head_dim]: keys (after norm and RoPE) and values by canvas
        position. In serving it is the model's preallocated KV pool (engine/kv_slots.py), each request's row its
        cache; the frame is rows [first_row, first_row + B) of it. The positions the forward does not compute
        are already there; the forward writes the fresh ones at `columns`, in place, then attends over the
        first K columns (`key_width`).
    columns: [B, A] the buffer column of each entry of `input_ids` (its canvas position; filler entries of a
        shorter row, and every entry of a dummy row, point at a column past K that attention never reads).
    positions: [B, A] the rotary position of each entry (its canvas position; any one below W for filler).
    visible: [B, 1, A, K] which keys each entry may attend to (block-causal, the row's own length); None when
        every entry sees all K columns.
    key_width: K; None → the buffer's whole width W.
    first_row: the buffer row of batch row 0.
    """

    buffer: torch.Tensor
    columns: torch.Tensor
    positions: torch.Tensor
    visible: torch.Tensor | None = None
    key_width: int | None = None
    first_row: int = 0


class LLaDA2MoeMLP(nn.Module):
    """SwiGLU: the dense layers' MLP, each expert, and the shared expert."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeGate(nn.Module):
    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, d] → (experts [N, top_k], mixing weights [N, top_k] float32)."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        biased = scores + self.expert_bias.float()
        tokens = biased.shape[0]
        # Group-limited routing: a group's score is the sum of its two best biased experts; only the experts of
        # the `topk_group` best groups compete for the token's `top_k` slots.
        group_scores = biased.view(tokens, self.n_group, -1).topk(2, dim=-1).values.sum(-1)
        kept_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
        expert_mask = group_mask[:, :, None].expand(-1, -1, biased.shape[1] // self.n_group).reshape(tokens, -1)
        experts = biased.masked_fill(~expert_mask, float("-inf")).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)  # the bias picks the experts; the mix uses the unbiased scores
        if self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return experts, weights * self.scaling


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: LLaDA2Config):
        super().__init__()
        d, f = config.hidden_size, config.moe_intermediate_size
        self.experts = nn.ModuleList(LLaDA2MoeMLP(d, f) for _ in range(config.num_experts))
        self.gate = LLaDA2MoeGate(config)
        self.shared_experts = LLaDA2MoeMLP(d, f * config.num_shared_experts) if config.num_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        experts, weights = self.gate(flat)
        top_k = experts.shape[1]
        # Batched dispatch: the (token, slot) assignments sorted by expert, one matmul per expert that has
        # tokens. The per-expert counts are read on the host (one small read per MoE layer) to cut the slices.
        order = experts.flatten().argsort(stable=True)
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts)).tolist()
        grouped = flat[order // top_k]
        outputs = []
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                outputs.append(expert(grouped[start : start + count]))
            start += count
        mixed = torch.empty_like(grouped)
        mixed[order] = torch.cat(outputs)
        # Sum the top-k slots in float32 with the weights (the official code mixes in the weights' dtype).
        y = (mixed.view(-1, top_k, shape[-1]).float() * weights[..., None]).sum(1).to(x.dtype)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(shape)


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config: LLaDA2Config):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.query_key_value = nn.Linear(d, (self.n_heads + 2 * self.n_kv_heads) * hd, bias=False)
        self.query_layernorm = RMSNorm(hd, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(hd, config.rms_norm_eps)
        self.dense = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, x, cos, sin, mask, kv: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> torch.Tensor:
        """x: [B, A, d]; cos/sin: [B, 1, A, rotary_dim]; mask: SDPA's attn_mask (bool or additive) or None.

        kv: (this layer's rows of the frame buffer [2, B, n_kv_heads, W, head_dim], the write index, K): the fresh
        keys and values are stored into the buffer, in place, and attention reads its first K columns.
        """
        batch, length, _ = x.shape
        qkv = self.query_key_value(x).view(batch, length, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = qkv.transpose(1, 2).split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        q = apply_partial_rope(self.query_layernorm(q), cos, sin)
        k = apply_partial_rope(self.key_layernorm(k), cos, sin)
        if kv is not None:
            buffer, index, key_width = kv
            keys, values = buffer[0], buffer[1]
            keys.scatter_(2, index, k)
            values.scatter_(2, index, v.contiguous())
            k, v = keys[:, :, :key_width], values[:, :, :key_width]
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.dense(attn.transpose(1, 2).reshape(batch, length, -1))


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config: LLaDA2Config, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LLaDA2MoeAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = (
            LLaDA2MoeMLP(config.hidden_size, config.intermediate_size)
            if layer < config.first_k_dense_replace
            else LLaDA2MoeSparseMoeBlock(config)
        )

    def forward(self, x, cos, sin, mask, kv=None) -> torch.Tensor:
        h = x + self.attention(self.input_layernorm(x), cos, sin, mask, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


def block_causal_mask(length: int, block_length: int, device: torch.device | None = None) -> torch.Tensor:
    """[length, length] bool, True where query i may see key j: j's block is i's or an earlier one."""
    blocks = torch.arange(length, device=device) // block_length
    return blocks[None, :] <= blocks[:, None]


class LLaDA2MoeModelLM(nn.Module):
    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # The rotated slice of each head (rotary_dim of head_dim) takes LLaDA's float32 tables at its own width.
        self.rotary = RotaryCache(config.rotary_dim, config.rope_theta, initial_length=4096)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv: BlockKVFrame | None = None,
        logit_index: LogitIndex | None = None,
        output_hidden_states: bool = False,
    ):
        """Logits of a [B, T] batch (float32, as the official head returns them).

        attention_mask: SDPA's mask for the plain forward, [B|1, 1, T, T] bool (True = may attend) or additive;
            e.g. `block_causal_mask`. Ignored with `kv` (its `visible` is the mask then).
        position_ids: [B|1, T]; None → 0..T-1. With `kv`, `kv.positions` is used.
        kv: compute only the entries of `input_ids` ([B, A]), reading and writing keys and values in the frame.
        logit_index: the entries (counted within each row of `input_ids`) whose logits are wanted → [N, V];
            None → [B, T, V].
        output_hidden_states: also return the embeddings, each layer's output and the final norm's (the last
            layer's output replaced by it, as the official code reports them).
        """
        device = input_ids.device
        if kv is not None:
            positions, mask = kv.positions, kv.visible
            index = kv.columns[:, None, :, None].expand(-1, self.config.num_key_value_heads, -1, self.config.head_dim)
            rows = slice(kv.first_row, kv.first_row + input_ids.shape[0])
            key_width = kv.key_width or kv.buffer.shape[-2]
            layer_kv = [(layer_buffer[:, rows], index, key_width) for layer_buffer in kv.buffer]
            bound = int(kv.buffer.shape[-2])  # positions are canvas columns of the buffer
        else:
            positions = position_ids if position_ids is not None else torch.arange(input_ids.shape[1], device=device)
            positions = positions.expand(input_ids.shape[0], -1) if positions.dim() == 2 else positions[None]
            mask = attention_mask
            layer_kv = [None] * len(self.model.layers)
            bound = input_ids.shape[1] if position_ids is None else self.config.max_sequence_length
        cos, sin = self.rotary.get(bound, device)  # [bound, rotary_dim]
        cos, sin = rope_rows(cos, positions), rope_rows(sin, positions)  # [B, 1, T, rotary_dim]
        x = self.model.word_embeddings(input_ids)
        hidden = [x]
        for layer, kv_of_layer in zip(self.model.layers, layer_kv):
            x = layer(x, cos, sin, mask, kv_of_layer)
            hidden.append(x)
        if logit_index is not None:
            x = x.gather(1, logit_index.columns[..., None].expand(-1, -1, x.shape[-1])).flatten(0, 1)
            if logit_index.real is not None:
                x = x[logit_index.real]
        x = self.model.norm(x)
        logits = self.lm_head(x).float()
        if output_hidden_states:
            hidden[-1] = x
            return logits, hidden
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def kv_bytes(self, positions: int) -> int:
        """Bytes of a block KV cache holding `positions` canvas positions (keys and values of every layer)."""
        c = self.config
        element = self.model.word_embeddings.weight.element_size()
        return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * positions * element
