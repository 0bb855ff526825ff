"""Build the embedded model's tokenizer offline: byte-level BPE trained on the synthetic corpus.

The files follow LLaDA-8B-Instruct's layout (PreTrainedTokenizerFast, its chat template copied verbatim,
its six special tokens appended after the BPE vocabulary as in the real checkpoint), so the serving code
loads it exactly as it loads LLaDA's.

Pre-tokenization is GPT-2's regex except that digits are split one per piece (` ?\\p{N}` instead of
` ?\\p{N}+`): numbers are then sequences of digit tokens, which arithmetic and counting need.

Usage: python scripts/build_tiny_tokenizer.py --out DIR   (default: models/tiny-llada-chat, overwritten)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

if __package__ in (None, ""):  # run as a script: make `scripts` and `engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.tiny_chat_corpus import tokenizer_training_text

SPECIAL_TOKENS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|mdm_mask|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
BOS, EOS, MASK = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]

# LLaDA-8B-Instruct's chat template, verbatim.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
)
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
VOCAB_LIMIT = 1024  # BPE entries; the corpus weights task words so that each is one token (a test checks)


def build_tokenizer(
    texts: list[str] | None = None,
    vocab_size: int = VOCAB_LIMIT,
    min_frequency: int = 1,
    special_tokens: list[str] | None = None,
) -> Tokenizer:
    """A byte-level BPE trained on `texts` (default: the embedded model's corpus), the special tokens appended
    after its vocabulary as in the real tokenizers. scripts/build_tiny_llada2.py builds LLaDA2's with it too."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_training_text() if texts is None else texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS if special_tokens is None else special_tokens)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = special_ids(tok)
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "fast_tokenizer": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 4096,
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    token = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    special_map = {
        "bos_token": {"content": BOS, **token},
        "eos_token": {"content": EOS, **token},
        "pad_token": {"content": EOS, **token},
    }
    generation = {"_from_model_config": True, "bos_token_id": ids[BOS], "eos_token_id": ids[EOS]}
    for name, data in [
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", special_map),
        ("generation_config.json", generation),
    ]:
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("models/tiny-llada-chat"), help="where to write the files")
    out = parser.parse_args().out
    tokenizer = build_tokenizer()
    save_tokenizer(tokenizer, out)
    print(f"vocab {tokenizer.get_vocab_size()} tokens, specials {special_ids(tokenizer)} -> {out}")
