"""Checkpoint configs, parsed by hand: which model family a checkpoint is, and the keys that set its math.

transformers' AutoConfig knows neither `model_type: llada` nor `Dream`, and both families' official
remote code fails under transformers 5, so we read the keys that determine the math ourselves and refuse
any flag whose value would change the math in a way this implementation does not cover. The family is
decided by `model_type` / `architectures` alone: nothing from the checkpoint is ever executed.

The config classes expose what the rest of the engine needs under the same names (`vocab_size`,
`max_sequence_length`, `mask_token_id`, `eos_token_id`, `pad_token_id`, `family`, `sampler_defaults`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from engine.family_rules import BLOCK_DIFFUSION_FIXED

# LLaDA-8B's special ids, used when a checkpoint does not declare its own.
LLADA_MASK_ID = 126336
LLADA_EOS_ID = 126081
LLADA_EOT_ID = 126348

# LLaDA2.x is trained with (and its authors decode with) blocks of 32 tokens.
LLADA2_BLOCK_LENGTH = 32

# Dream's linear-timestep schedule ends at t = eps instead of 0; its generation_config.json default.
DREAM_TIMESTEP_EPS = 1e-3


@dataclass(frozen=True)
class SamplerDefaults:
    """A family's own sampler settings: what a request that leaves these out runs with.

    timestep_eps parameterises the "dream" block schedule (any family may ask for it). The rest are the
    block-diffusion family's (LLaDA2), applied by `SamplingParams.for_model` to what a request leaves out:
    its block length, its confidence threshold (one for LLaDA2.0's sampler, one once `editing_threshold`
    selects LLaDA2.1's), and `aligned_blocks`: blocks are aligned to position 0 and the canvas is rounded up
    to whole blocks, so the answer's length need not be a multiple of the block length. `fixed_knobs`: the
    knobs the family refuses any setting of (engine/family_rules.py), which a form for it leaves out.
    A LLaDA checkpoint may declare a block length too (generation_config.json): without aligned blocks it is
    the default only where it fits the request (`SamplingParams.for_model`).
    """

    block_schedule: str
    confidence_metric: str
    timestep_eps: float = DREAM_TIMESTEP_EPS
    block_length: int | None = None
    confidence_threshold: float | None = None
    editing_confidence_threshold: float | None = None
    aligned_blocks: bool = False
    fixed_knobs: tuple[str, ...] = ()


# Flags this implementation assumes; any other value is a different architecture.
_REQUIRED_FLAGS = {
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "rope": True,
    "alibi": False,
    "weight_tying": False,
    "include_bias": False,
    "attention_layer_norm": False,
    "input_emb_norm": False,
    "scale_logits": False,
}


@dataclass(frozen=True)
class LLaDAConfig:
    family: ClassVar[str] = "llada"

    d_model: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    mlp_hidden_size: int
    vocab_size: int  # rows of the embedding and of the LM head (`embedding_size`), padding included
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_sequence_length: int = 4096
    mask_token_id: int = LLADA_MASK_ID
    eos_token_id: int = LLADA_EOS_ID
    pad_token_id: int = LLADA_EOS_ID
    # generation_config.json `block_length`: the block length the checkpoint is meant to be decoded with, the
    # default of a request that sets none (or its smallest multiple that fits the canvas and steps); None: one
    # block, as generate() does.
    block_length: int | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def sampler_defaults(self) -> SamplerDefaults:
        # The official generate(): LLaDA's uniform schedule, low-confidence remasking (top-1 probability).
        return SamplerDefaults("uniform", "top1_prob", block_length=self.block_length)

    @classmethod
    def from_dict(cls, raw: dict, generation: dict | None = None) -> LLaDAConfig:
        for key, expected in _REQUIRED_FLAGS.items():
            if key in raw and raw[key] != expected:
                raise ValueError(f"unsupported LLaDA config: {key}={raw[key]!r} (only {expected!r} is implemented)")
        if raw.get("include_qkv_bias"):
            raise ValueError("unsupported LLaDA config: include_qkv_bias=true")
        d_model = raw["d_model"]
        n_heads = raw["n_heads"]
        n_kv_heads = raw.get("n_kv_heads") or n_heads
        if raw.get("multi_query_attention"):
            n_kv_heads = 1
        mlp_hidden = raw.get("mlp_hidden_size") or raw["mlp_ratio"] * d_model
        eos = raw.get("eos_token_id", LLADA_EOS_ID)
        block_length = (generation or {}).get("block_length")
        if block_length is not None and (type(block_length) is not int or block_length < 1):
            raise ValueError(f"unsupported LLaDA generation_config: block_length={block_length!r} (a positive integer)")
        return cls(
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            n_layers=raw["n_layers"],
            mlp_hidden_size=mlp_hidden,
            vocab_size=raw.get("embedding_size") or raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=raw.get("rope_theta", 10000.0),
            max_sequence_length=raw.get("max_sequence_length", 4096),
            mask_token_id=raw.get("mask_token_id", LLADA_MASK_ID),
            eos_token_id=eos,
            pad_token_id=raw.get("pad_token_id", eos),
            block_length=block_length,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> LLaDAConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict:
        """The config.json of a checkpoint in LLaDA's own format (what the official code expects)."""
        return {
            "architectures": ["LLaDAModelLM"],
            "model_type": "llada",
            "activation_type": "silu",
            "alibi": False,
            "attention_layer_norm": False,
            "bias_for_layer_norm": False,
            "block_group_size": 1,
            "block_type": "llama",
            "d_model": self.d_model,
            "embedding_size": self.vocab_size,
            "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "mask_token_id": self.mask_token_id,
            "include_bias": False,
            "include_qkv_bias": False,
            "input_emb_norm": False,
            "layer_norm_type": "rms",
            "layer_norm_with_affine": True,
            "max_sequence_length": self.max_sequence_length,
            "mlp_hidden_size": self.mlp_hidden_size,
            "mlp_ratio": self.mlp_hidden_size // self.d_model,
            "multi_query_attention": None,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "n_layers": self.n_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope": True,
            "rope_full_precision": True,
            "rope_theta": self.rope_theta,
            "scale_logits": False,
            "use_cache": False,
            "weight_tying": False,
        }


# Qwen2 keys whose other values this implementation does not compute (sliding windows, scaled or
# multimodal RoPE, tied embeddings).
_DREAM_REQUIRED_FLAGS = {
    "hidden_act": "silu",
    "use_sliding_window": False,
    "rope_scaling": None,
    "use_mrope": False,
    "tie_word_embeddings": False,
}


# Alike in shape to LLaDAConfig on purpose: each family's fields keep the names of its own config.json (Qwen2's
# here), so that reading one against its checkpoint's file is direct, and a field one family lacks cannot
# leak into the other.
@dataclass(frozen=True)
class DreamConfig:
    """Dream-v0 / DiffuCoder: Qwen2 shapes (GQA, q/k/v biases), bidirectional attention, shifted logits."""

    family: ClassVar[str] = "dream"

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int  # rows of the embedding and of the LM head, padding included
    mask_token_id: int  # from config.json: Dream's generation_config.json has it null
    eos_token_id: int
    pad_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_sequence_length: int = 131072  # `max_position_embeddings`
    timestep_eps: float = DREAM_TIMESTEP_EPS  # generation_config.json `eps`

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def sampler_defaults(self) -> SamplerDefaults:
        # The choice for Dream: its linear-timestep schedule, ranked by (negative) entropy, which is
        # the rule Dream's model card uses. generation_config.json's own `alg` ("origin") draws the positions
        # at random and is not offered.
        return SamplerDefaults("dream", "entropy_inverse", self.timestep_eps)

    @classmethod
    def from_dict(cls, raw: dict, generation: dict | None = None) -> DreamConfig:
        for key, expected in _DREAM_REQUIRED_FLAGS.items():
            if key in raw and raw[key] != expected:
                raise ValueError(f"unsupported Dream config: {key}={raw[key]!r} (only {expected!r} is implemented)")
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        if raw.get("head_dim", hidden // heads) != hidden // heads:
            raise ValueError(f"unsupported Dream config: head_dim={raw['head_dim']} is not hidden_size / heads")
        if raw.get("mask_token_id") is None:
            raise ValueError("Dream config.json has no mask_token_id: cannot tell which token is the mask")
        eos = raw["eos_token_id"]
        eps = (generation or {}).get("eps")
        if eps is not None and not 0 <= eps < 1:
            raise ValueError(f"unsupported Dream generation_config: eps={eps!r} (the schedule's end time, in [0, 1))")
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            num_hidden_layers=raw["num_hidden_layers"],
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            mask_token_id=raw["mask_token_id"],
            eos_token_id=eos,
            pad_token_id=raw.get("pad_token_id") if raw.get("pad_token_id") is not None else eos,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=raw.get("rope_theta", 10000.0),
            max_sequence_length=raw.get("max_position_embeddings", 131072),
            timestep_eps=DREAM_TIMESTEP_EPS if eps is None else float(eps),
        )


# LLaDA2.x keys whose other values the official `modeling_llada2_moe.py` computes differently (or that no
# checkpoint of the family has used): biases, untied or normalised heads, scaled RoPE, softmax routing.
_LLADA2_REQUIRED_FLAGS = {
    "hidden_act": "silu",
    "use_qkv_bias": False,
    "use_bias": False,
    "use_qk_norm": True,
    "tie_word_embeddings": False,
    "rope_scaling": None,
    "norm_head": False,
    "moe_router_enable_expert_bias": True,
}


@dataclass(frozen=True)
class LLaDA2Config:
    """LLaDA2.0 / LLaDA2.1 (`model_type: llada2_moe`): a block-diffusion MoE (tests/fixtures/llada2-tiny/README.md).

    Attention is causal between blocks and bidirectional inside one, so the sampler keeps an exact KV cache
    (engine/block_sampler.py); the block length is a request setting, not a config key.
    """

    family: ClassVar[str] = "llada2"
    # No schedule choice and one confidence metric: the official samplers rank by the top-1 probability. The
    # authors' settings: blocks of 32 and LLaDA2.0's threshold decoding at 0.95 (the official generate()'s
    # default, SGLang's LowConfidence default); with editing_threshold set (LLaDA2.1), 0.7, the threshold of
    # LLaDA2.1's quality mode (diffusers' LLaDA2 pipeline docs: 0.7 with editing 0.5); the speed mode (0.5
    # with editing 0, SGLang's JointThreshold defaults) is one request away.
    sampler_defaults: ClassVar[SamplerDefaults] = SamplerDefaults(
        "uniform",
        "top1_prob",
        block_length=LLADA2_BLOCK_LENGTH,
        confidence_threshold=0.95,
        editing_confidence_threshold=0.7,
        aligned_blocks=True,
        fixed_knobs=BLOCK_DIFFUSION_FIXED,
    )

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    intermediate_size: int  # the dense MLP of the first `first_k_dense_replace` layers
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    num_shared_experts: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    partial_rotary_factor: float
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 600000.0
    max_sequence_length: int = 32768  # `max_position_embeddings`

    @property
    def rotary_dim(self) -> int:
        # The official code takes int(head_dim × partial_rotary_factor); config.json's own `rotary_dim` is not read.
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, raw: dict) -> LLaDA2Config:
        for key, expected in _LLADA2_REQUIRED_FLAGS.items():
            if key in raw and raw[key] != expected:
                raise ValueError(f"unsupported LLaDA2 config: {key}={raw[key]!r} (only {expected!r} is implemented)")
        if raw.get("score_function", "sigmoid") != "sigmoid":
            raise ValueError(f"unsupported LLaDA2 config: score_function={raw['score_function']!r} (only 'sigmoid')")
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        experts, groups = raw["num_experts"], raw["n_group"]
        if experts % groups or experts // groups < 2:
            # Group scores are the sum of each group's two best experts.
            raise ValueError(f"unsupported LLaDA2 config: {experts} experts in {groups} groups (need ≥ 2 per group)")
        if raw.get("mask_token_id") is None:
            raise ValueError("LLaDA2 config.json has no mask_token_id: cannot tell which token is the mask")
        rotary = int((raw.get("head_dim") or hidden // heads) * raw.get("partial_rotary_factor", 1.0))
        if rotary % 2:
            raise ValueError(f"unsupported LLaDA2 config: an odd rotary dimension ({rotary})")
        eos = raw["eos_token_id"]
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            num_hidden_layers=raw["num_hidden_layers"],
            intermediate_size=raw["intermediate_size"],
            moe_intermediate_size=raw["moe_intermediate_size"],
            num_experts=experts,
            num_experts_per_tok=raw["num_experts_per_tok"],
            n_group=groups,
            topk_group=raw["topk_group"],
            num_shared_experts=raw.get("num_shared_experts") or 0,
            first_k_dense_replace=raw.get("first_k_dense_replace", 0),
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            partial_rotary_factor=float(raw.get("partial_rotary_factor", 1.0)),
            vocab_size=raw["vocab_size"],
            mask_token_id=raw["mask_token_id"],
            eos_token_id=eos,
            pad_token_id=raw.get("pad_token_id") if raw.get("pad_token_id") is not None else eos,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(raw.get("rope_theta", 600000.0)),
            max_sequence_length=raw.get("max_position_embeddings", 32768),
        )


ModelConfig = LLaDAConfig | DreamConfig | LLaDA2Config


def model_family(raw: dict) -> str:
    """The family ("llada", "dream" or "llada2") from config.json's model_type / architectures (no remote code)."""
    model_type = str(raw.get("model_type", "")).lower()
    architectures = set(raw.get("architectures") or ())
    if model_type == "llada" or "LLaDAModelLM" in architectures:
        return "llada"
    if model_type == "dream" or "DreamModel" in architectures:
        return "dream"
    if model_type == "llada2_moe" or "LLaDA2MoeModelLM" in architectures:
        return "llada2"
    raise ValueError(
        f"unsupported model: model_type={raw.get('model_type')!r}, architectures={sorted(architectures)} "
        "(supported: LLaDA (model_type llada), Dream / DiffuCoder (model_type Dream) and LLaDA2.x (llada2_moe))"
    )


def read_config(model_dir: str | Path) -> ModelConfig:
    """The config of the checkpoint in `model_dir`, as the class of its family."""
    model_dir = Path(model_dir)
    raw = json.loads((model_dir / "config.json").read_text())
    family = model_family(raw)
    generation_file = model_dir / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.exists() else None
    if family == "llada":
        return LLaDAConfig.from_dict(raw, generation)
    if family == "llada2":
        return LLaDA2Config.from_dict(raw)
    return DreamConfig.from_dict(raw, generation)
