"""LLaDA2 model shapes for the benchmarks, and random-weight models of them built directly on a device.

Speed depends on shapes, not on weight values, so the benchmarks need no checkpoint: LLaDA2-mini's real shapes
(tests/fixtures/llada2-tiny/README.md, section 9) for the GPU benchmark, a mid-sized config whose arithmetic is
visible on a CPU, and a tiny one for smoke checks. The special ids sit at the top of each vocabulary (the real
model's mask and EOS are 156895 and 156892).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import LLaDA2Config
from engine.llada2 import LLaDA2MoeModelLM

# inclusionAI/LLaDA2.1-mini's config.json (LLaDA2.0-mini has the same shapes): 16 B parameters, about 1.4 B
# active per token (8 of 256 experts, the shared expert, attention, the dense first layer, embeddings and head).
LLADA2_MINI = LLaDA2Config(
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=128, num_hidden_layers=20,
    intermediate_size=5120, moe_intermediate_size=512, num_experts=256, num_experts_per_tok=8, n_group=8,
    topk_group=4, num_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
    partial_rotary_factor=0.5, vocab_size=157184, mask_token_id=156895, eos_token_id=156892,
    pad_token_id=156892, rms_norm_eps=1e-6, rope_theta=600000.0, max_sequence_length=32768,
)  # fmt: skip
# Large enough that a forward's arithmetic, not per-op overhead, shows on a CPU; small enough for seconds a run.
LLADA2_MID = replace(
    LLADA2_MINI, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_hidden_layers=4,
    intermediate_size=1024, moe_intermediate_size=256, num_experts=16, num_experts_per_tok=4, n_group=4,
    topk_group=2, vocab_size=2048, mask_token_id=2047, eos_token_id=2044, pad_token_id=2044,
)  # fmt: skip
# The same architecture at the fixture's size: smoke checks of the GPU benchmark on CPU.
LLADA2_TINY = replace(
    LLADA2_MINI, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
    intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
    vocab_size=512, mask_token_id=511, eos_token_id=508, pad_token_id=508,
)  # fmt: skip


class TokenIds:
    """What the engine reads of a tokenizer, for a model without one: prompts are token ids, and no token stops
    a request (`stop_ids` is empty), so that every request computes its whole canvas: random weights put EOS
    anywhere, and LLaDA2.0 ends at the first block holding one whatever `early_exit` says."""

    max_chars_per_token = None
    stop_ids: frozenset[int] = frozenset()

    def __init__(self, config: LLaDA2Config):
        self.mask_id, self.eos_id = config.mask_token_id, config.eos_token_id

    def decode(self, ids: list[int]) -> str:
        return ""  # text is not measured; decoding would only add host work that the official loop does not do


def random_prompt(config: LLaDA2Config, length: int, seed: int) -> list[int]:
    """Random ids below every special id."""
    generator = torch.Generator().manual_seed(seed)
    top = min(config.mask_token_id, config.eos_token_id, config.pad_token_id)
    return torch.randint(0, top, (length,), generator=generator).tolist()


def random_llada2(config: LLaDA2Config, device: torch.device | str, dtype: torch.dtype, seed: int = 0):
    """The config's model with random weights, allocated once on the device in `dtype` (no fp32 or host copy).

    Linear weights are N(0, 1/fan_in) so activations keep their scale through the layers and logits spread
    (near-uniform logits would make argmax ties that say nothing); the router gets a small random expert bias so
    that group-limited routing spreads tokens over the experts as a trained router does.
    """
    with torch.device("meta"):
        model = LLaDA2MoeModelLM(config)
    model = model.to(dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0)  # RMSNorm scales
            elif name.endswith("word_embeddings.weight"):
                param.normal_(std=1.0, generator=generator)
            else:
                param.normal_(std=param.shape[1] ** -0.5, generator=generator)
        for name, buffer in model.named_buffers():
            assert name.endswith("expert_bias"), name  # the only buffer: to_empty left it uninitialised
            buffer.normal_(std=0.1, generator=generator)
    return model.eval().requires_grad_(False)


def parameter_counts(config: LLaDA2Config) -> tuple[int, int]:
    """(total parameters, parameters one token uses: every weight but the experts it is not routed to)."""
    with torch.device("meta"):
        model = LLaDA2MoeModelLM(config)
    total = model.num_parameters()
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    idle = moe_layers * (config.num_experts - config.num_experts_per_tok) * per_expert
    return total, total - idle
