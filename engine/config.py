"""LLaDA's config.json, parsed by hand.

transformers' AutoConfig does not know `model_type: llada` and the official remote code does not load
under transformers 5, so we read the keys that determine the math ourselves and refuse any flag whose
value would change the math in a way this implementation does not cover.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# LLaDA-8B's special ids, used when a checkpoint does not declare its own.
LLADA_MASK_ID = 126336
LLADA_EOS_ID = 126081
LLADA_EOT_ID = 126348

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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, raw: dict) -> LLaDAConfig:
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
