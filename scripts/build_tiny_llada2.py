"""Build tests/fixtures/llada2-chat-tiny/: a tiny random-weight LLaDA2.x checkpoint with a real tokenizer.

The checkpoint is laid out as inclusionAI's LLaDA2.0-mini / LLaDA2.1-mini are (config.json with the
`llada2_moe` keys, the official tensor names, a `PreTrainedTokenizerFast` with the family's special tokens
and a chat template of the same structure), so the serving path (chat template, special ids, HTTP) can be
tested end to end on CPU. The weights are random: the text it writes means nothing.

Everything is seeded and the inputs are fixed, so two runs write byte-identical files. The tokenizer is a
byte-level BPE trained on a small fixed corpus, the way scripts/build_tiny_tokenizer.py builds the
embedded model's; the special tokens are appended after the BPE vocabulary in the order the real
vocabulary has them (<|startoftext|>, <|endoftext|>, [CLS], [gMASK], then <|mask|> three ids after EOS,
as 156892 → 156895 in the real one). tests/fixtures/llada2-chat-tiny/README.md gives the sources.

Usage: python scripts/build_tiny_llada2.py [--out DIR]   (default: tests/fixtures/llada2-chat-tiny)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

if __package__ in (None, ""):  # run as a script: make `scripts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.build_tiny_tokenizer import build_tokenizer as build_byte_level_bpe

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llada2-chat-tiny"
SEED = 20260
BPE_VOCAB_LIMIT = 512  # 256 byte symbols + merges; the corpus below is small, so it may stop short of this
VOCAB_MULTIPLE = 64  # the real vocab_size (157184) is the tokenizer's size padded to a multiple of 64

BOS, EOS, CLS, GMASK, MASK = "<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|mask|>"
ROLE_END, ROLE_OPEN, ROLE_CLOSE = "<|role_end|>", "<role>", "</role>"
SPECIAL_TOKENS = [BOS, EOS, CLS, GMASK, MASK, ROLE_END, ROLE_OPEN, ROLE_CLOSE]

# The structure of LLaDA2's chat template (tokenizer_config.json of inclusionAI/LLaDA2.1-flash; the README
# cites it), written out for the roles this server accepts: a SYSTEM header that always comes first, holding
# a leading system message and then the fixed "detailed thinking off" switch; HUMAN / SYSTEM / ASSISTANT
# turns, each closed by <|role_end|>; contents are not trimmed. Left out: the tool-calling preamble and
# the OBSERVATION role, and the split of an assistant turn's `</think>` reasoning.
CHAT_TEMPLATE = (
    "{%- set thinking_option = 'off' -%}"
    "{{- '<role>SYSTEM</role>' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n' -}}{%- endif -%}"
    "{{- 'detailed thinking ' + thinking_option + '<|role_end|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<role>HUMAN</role>' + message.content + '<|role_end|>' -}}"
    "{%- elif message.role == 'system' and not loop.first -%}"
    "{{- '<role>SYSTEM</role>' + message.content + '<|role_end|>' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<role>ASSISTANT</role>' + message.content + '<|role_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}"
)

# A small fixed corpus (our own text): chat-like English, the template's role names, digits and code, so
# that common words become single tokens and the rest falls back to bytes.
CORPUS = [
    "Hello! How are you today? I am fine, thank you.",
    "What is the capital of France? The capital of France is Paris.",
    "Please write a short poem about the sea and the moon.",
    "The quick brown fox jumps over the lazy dog.",
    "Count from one to ten: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "You are a helpful assistant. Answer the question in one sentence.",
    "Explain why the sky is blue in simple words.",
    "A diffusion language model fills masked positions of a block in parallel.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "The answer is 42. Is there anything else I can help you with?",
    "Once upon a time, there was a small town by a river.",
    "Translate 'good morning' into French: bonjour.",
    "Thanks for your question. Here is a list:\n- apples\n- bread\n- milk\n",
    "I do not know the answer, but I can try to find out.",
    "Summarize the text in three short points.",
]
ROLE_WORDS = ["SYSTEM", "HUMAN", "ASSISTANT", "OBSERVATION", "detailed thinking off", "detailed thinking on"]


def training_text() -> list[str]:
    return CORPUS * 20 + ROLE_WORDS * 50


def build_tokenizer() -> Tokenizer:
    return build_byte_level_bpe(training_text(), BPE_VOCAB_LIMIT, min_frequency=2, special_tokens=SPECIAL_TOKENS)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def padded_vocab_size(tok: Tokenizer) -> int:
    return math.ceil(tok.get_vocab_size() / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def tokenizer_files(tok: Tokenizer) -> dict[str, dict]:
    ids = special_ids(tok)
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    added = {str(ids[t]): {"content": t, **flags, "special": True} for t in SPECIAL_TOKENS}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "cls_token": CLS,
        "eos_token": EOS,
        "model_max_length": 32768,
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    special_map = {
        "bos_token": {"content": BOS, **flags},
        "cls_token": {"content": CLS, **flags},
        "eos_token": {"content": EOS, **flags},
        "pad_token": {"content": EOS, **flags},
    }
    return {"tokenizer_config.json": config, "special_tokens_map.json": special_map}


def model_config(tok: Tokenizer) -> dict:
    """The key set of a real LLaDA2.x config.json (as in the shared llada2-tiny fixture), tiny sizes."""
    ids = special_ids(tok)
    return {
        "architectures": ["LLaDA2MoeModelLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "dtype": "float32",
        "embedding_dropout": 0.0,
        "eos_token_id": ids[EOS],
        "first_k_dense_replace": 1,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "mask_token_id": ids[MASK],
        "max_position_embeddings": 1024,
        "max_window_layers": 28,
        "model_type": "llada2_moe",
        "moe_intermediate_size": 32,
        "moe_router_enable_expert_bias": True,
        "n_group": 4,
        "norm_head": False,
        "norm_softmax": False,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "num_shared_experts": 1,
        "output_dropout": 0.0,
        "output_router_logits": False,
        "pad_token_id": ids[EOS],
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 600000,
        "rotary_dim": 8,
        "routed_scaling_factor": 2.5,
        "router_dtype": "fp32",
        "score_function": "sigmoid",
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "topk_group": 2,
        "use_bias": False,
        "use_cache": False,
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_rmsnorm": True,
        "use_sliding_window": False,
        "vocab_size": padded_vocab_size(tok),
    }


def generation_config(tok: Tokenizer) -> dict:
    # Shaped like the Ling 2.0 base model's (the README cites it): EOS and pad are <|endoftext|>.
    ids = special_ids(tok)
    return {"do_sample": False, "eos_token_id": ids[EOS], "pad_token_id": ids[EOS]}


def random_weights(config: dict) -> dict[str, torch.Tensor]:
    """Seeded random float32 weights under the official tensor names and shapes.

    Linear weights are N(0, 1/fan_in) so activations keep their scale through the layers; embeddings have
    std 1 and the untied head std 0.85 (the shared fixture's choices); norm weights 1+N(0, 0.1) and a random
    router `expert_bias` N(0, 0.2), so that a loader that skips a norm weight, or routes without the bias,
    computes different logits.
    """
    generator = torch.Generator().manual_seed(SEED)
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    vocab = config["vocab_size"]

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, std=in_features**-0.5)

    def norm(size: int) -> torch.Tensor:
        return 1 + normal(size, std=0.1)

    def swiglu(prefix: str, inner: int) -> dict[str, torch.Tensor]:
        return {
            f"{prefix}.gate_proj.weight": linear(inner, hidden),
            f"{prefix}.up_proj.weight": linear(inner, hidden),
            f"{prefix}.down_proj.weight": linear(hidden, inner),
        }

    weights = {"model.word_embeddings.weight": normal(vocab, hidden, std=1.0)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        weights[f"{p}.input_layernorm.weight"] = norm(hidden)
        weights[f"{p}.attention.query_key_value.weight"] = linear((heads + 2 * kv_heads) * head_dim, hidden)
        weights[f"{p}.attention.query_layernorm.weight"] = norm(head_dim)
        weights[f"{p}.attention.key_layernorm.weight"] = norm(head_dim)
        weights[f"{p}.attention.dense.weight"] = linear(hidden, heads * head_dim)
        weights[f"{p}.post_attention_layernorm.weight"] = norm(hidden)
        if layer < config["first_k_dense_replace"]:
            weights.update(swiglu(f"{p}.mlp", config["intermediate_size"]))
            continue
        weights[f"{p}.mlp.gate.weight"] = linear(config["num_experts"], hidden)
        weights[f"{p}.mlp.gate.expert_bias"] = normal(config["num_experts"], std=0.2)
        for expert in range(config["num_experts"]):
            weights.update(swiglu(f"{p}.mlp.experts.{expert}", config["moe_intermediate_size"]))
        shared = config["moe_intermediate_size"] * config["num_shared_experts"]
        weights.update(swiglu(f"{p}.mlp.shared_experts", shared))
    weights["model.norm.weight"] = norm(hidden)
    weights["lm_head.weight"] = normal(vocab, hidden, std=0.85)
    return {name: tensor.contiguous() for name, tensor in sorted(weights.items())}


def build(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(out_dir / "tokenizer.json"))
    config = model_config(tok)
    files = {**tokenizer_files(tok), "config.json": config, "generation_config.json": generation_config(tok)}
    for name, data in files.items():
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")
    save_file(random_weights(config), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {
        "tokenizer_size": tok.get_vocab_size(),
        "vocab_size": config["vocab_size"],
        "special_ids": special_ids(tok),
        "sha256": {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(out_dir.iterdir()) if p.is_file()
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the files")
    print(json.dumps(build(parser.parse_args().out), indent=2))
