"""Tokenizer glue: chat template, special ids, and encoding that never lets user text become a special token.

A user who types "<|mdm_mask|>" (LLaDA) or "<|mask|>" (Dream, LLaDA2) must not create a masked position
(the sampler would fill it), nor forge a turn header. So the chat template is rendered with placeholders in
place of each message's content: special tokens are taken only from the template's own text, and the
text around them (template text and contents alike) is encoded with special tokens split into ordinary
text.

That text is encoded in the same runs as the official tokenization of the whole rendered prompt: a
tokenizer cuts its input at special tokens first and encodes each run between them independently, so
cutting at the template's special tokens gives the official ids whenever the user text contains no
special token. Encoding template text and content separately would not: Dream's template puts "user\n"
right before the content, and a content starting with "\n" joins that newline into one "\n\n" token.

LLaDA2's template does not trim either: a leading system message is followed by "\ndetailed thinking off"
in the same run, and a user turn sits between "</role>" and "<|role_end|>", both special tokens.

A template that trims the content (LLaDA's) leaves no whitespace at the content's edges to join across,
and there the content stays a run of its own: for LLaDA's tokenizer that gives the same ids as one run,
and it is how the embedded model was trained (its GPT-2-style split would otherwise encode the header's
"\n\n" before the content as two newline tokens instead of one).
"""

from __future__ import annotations

import re
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from engine.config import LLADA_EOS_ID, LLADA_EOT_ID, LLADA_MASK_ID, ModelConfig, read_config
from engine.prompt import CHAT_ROLES


# The token that ends an assistant turn, per family (the other stop token is the config's EOS). LLaDA2's
# template closes every turn with <|role_end|>. Its official generate() stops on EOS only (id 156892, also
# config.json's pad id), and dFactory's SFT code pads each conversation, after its closing <|role_end|>, with
# the pad token: the model writes <|role_end|> then EOS, so cutting at the first of either gives the same text.
@dataclass(frozen=True)
class MessageOverhead:
    """What the chat template adds to a prompt per message, at least (`ChatTokenizer.message_overhead`)."""

    special_tokens: int  # the template's special tokens: each is one token, never merged with text
    chars: int  # characters of its other text, tokenized with the content


END_OF_TURN_TOKENS = {"llada": "<|eot_id|>", "dream": "<|im_end|>", "llada2": "<|role_end|>"}


def load_hf_tokenizer(model_dir: str | Path, family: str):
    """The checkpoint's tokenizer, without running any code from the checkpoint.

    LLaDA and LLaDA2 ship a tokenizer.json. Dream ships only vocab.json + merges.txt and names its remote-code
    class `DreamTokenizer`, which is transformers' Qwen2 tokenizer renamed: loading it as `Qwen2Tokenizer` gives
    the same ids without remote code (checked on the fixture's prompts and strings).
    """
    from transformers import AutoTokenizer, Qwen2Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # silence the "model of type llada/Dream" notice: we only load a tokenizer
    if family == "dream":
        return Qwen2Tokenizer.from_pretrained(str(model_dir))
    # trust_remote_code=False: LLaDA's and LLaDA2's configs carry auto_map, and transformers 5 would otherwise
    # ask interactively whether to run the remote code. It then falls back to a plain tokenizer. Reading that
    # config warns about LLaDA2's `rope_scaling: null` key, which concerns the model, not the tokenizer.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`rope_scaling` is deprecated", category=FutureWarning)
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)


class ChatTokenizer:
    def __init__(
        self, hf_tokenizer, mask_id: int, eos_id: int, eot_id: int, extra_stop_ids: frozenset[int] = frozenset()
    ):
        """extra_stop_ids: tokens that also end the answer besides EOS and the end of turn (see from_pretrained)."""
        self.hf = hf_tokenizer
        self.mask_id = mask_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.stop_ids = frozenset({eos_id, eot_id}) | extra_stop_ids
        self._trims_content = self._template_trims_content()
        # What a tokenizer cuts at before anything else: its special added tokens (longest first, so that
        # no token matches inside a longer one). Both families' special tokens have no strip flags.
        specials = sorted((t.content for t in hf_tokenizer.added_tokens_decoder.values() if t.special), key=len)
        self._special_ids = {token: hf_tokenizer.convert_tokens_to_ids(token) for token in specials}
        self._special_pattern = re.compile("(" + "|".join(re.escape(t) for t in reversed(specials)) + ")")
        self.max_chars_per_token = _max_chars_per_token(hf_tokenizer)
        self.message_overhead = self._measure_message_overhead()

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: ModelConfig | None = None) -> ChatTokenizer:
        config = config or read_config(model_dir)
        hf = load_hf_tokenizer(model_dir, config.family)
        mask_id = config.mask_token_id if config.mask_token_id is not None else LLADA_MASK_ID
        eos_id = config.eos_token_id if config.eos_token_id is not None else (hf.eos_token_id or LLADA_EOS_ID)
        end_of_turn = END_OF_TURN_TOKENS[config.family]
        eot_id = hf.convert_tokens_to_ids(end_of_turn)
        if eot_id is None or eot_id == hf.unk_token_id:
            if config.family != "llada":
                raise ValueError(f"the tokenizer in {model_dir} has no {end_of_turn} token")
            eot_id = LLADA_EOT_ID
        # DiffuCoder fills the canvas after its answer with its own pad token, `<|dlm_pad|>`, and its authors
        # cut the text there; Dream's pad is its EOS. A Dream-family pad token is therefore an end too.
        extra = frozenset()
        if config.family == "dream" and hf.pad_token_id not in (None, eos_id, mask_id):
            extra = frozenset({hf.pad_token_id})
        return cls(hf, mask_id=mask_id, eos_id=eos_id, eot_id=eot_id, extra_stop_ids=extra)

    def _render(self, messages: list[dict]) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _template_trims_content(self) -> bool:
        probe = f"\ue000{uuid.uuid4().hex}\ue001"
        return f" {probe} " not in self._render([{"role": "user", "content": f" {probe} "}])

    def _measure_message_overhead(self) -> MessageOverhead:
        """The least the chat template adds per message: its special tokens (each exactly one token) and the
        characters of its other text (roles, separators), whichever role the message has.

        Measured as the difference a message makes when appended to a conversation of one and of two messages,
        with placeholder contents (as `encode_chat` renders them); the smallest over the roles and positions
        the template accepts. A role the template refuses there is skipped: such a conversation fails anyway.
        """

        def measure(messages: list[dict]) -> tuple[int, int]:
            rendered = self._render(messages)
            for message in messages:
                rendered = rendered.replace(message["content"], "")
            parts = self._special_pattern.split(rendered) if self._special_ids else [rendered]
            return len(parts) // 2, sum(len(part) for part in parts[::2])

        def placeholder() -> str:
            return f"\ue000{uuid.uuid4().hex}\ue001"

        specials, chars = [], []
        for size in (1, 2):
            base = [{"role": ("user", "assistant")[i % 2], "content": placeholder()} for i in range(size)]
            for role in CHAT_ROLES:
                try:
                    before = measure(base)
                    after = measure(base + [{"role": role, "content": placeholder()}])
                except Exception:  # noqa: BLE001 - a template may raise on a role order it does not accept
                    continue
                specials.append(max(0, after[0] - before[0]))
                chars.append(max(0, after[1] - before[1]))
        return MessageOverhead(min(specials, default=0), min(chars, default=0))

    def content_chars(self, content: str) -> int:
        """How many characters of a message's content reach the tokenizer (a trimming template drops its edges)."""
        return len(content.strip()) if self._trims_content else len(content)

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings inside `text` stay ordinary text."""
        return self.hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def encode_prompt(self, text: str) -> list[int]:
        """Raw prompt text (no chat template) to ids: what the tokenizer adds to any text by default (a BOS for
        tokenizers configured so), then `text` with special-token strings kept as ordinary text."""
        return self.hf(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        placeholders = [f"\ue000{uuid.uuid4().hex}\ue001" for _ in messages]
        rendered = self._render([{**m, "content": p} for m, p in zip(messages, placeholders)])
        ids: list[int] = []
        run: list[str] = []  # the text since the last template special token
        start = 0  # an index, not a shrinking remainder string: copying the rest per message is quadratic
        for message, placeholder in zip(messages, placeholders):
            found = rendered.find(placeholder, start)
            if found < 0:
                raise ValueError("the chat template dropped a message; cannot tokenize this conversation safely")
            self._add_template_text(rendered[start:found], ids, run)
            if self._trims_content:
                ids += self._encode_run(run)
                ids += self.encode_text(message["content"].strip())
            else:
                run.append(message["content"])
            start = found + len(placeholder)
        self._add_template_text(rendered[start:], ids, run)
        return ids + self._encode_run(run)

    def _encode_run(self, run: list[str]) -> list[int]:
        """Encode the pending text as one run and empty it. Most template special tokens follow another one, so
        the run is often empty: no tokenizer call for it (about a third of a short chat's)."""
        text = "".join(run)
        run.clear()
        return self.encode_text(text) if text else []

    def _add_template_text(self, text: str, ids: list[int], run: list[str]) -> None:
        """Template text: its special tokens become their ids, cutting the run of text; the rest joins the run."""
        for index, part in enumerate(self._special_pattern.split(text) if self._special_ids else [text]):
            if index % 2 == 0:  # re.split with one group alternates text, separator, text, …
                run.append(part)
                continue
            ids += self._encode_run(run)
            ids.append(self._special_ids[part])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The text of one token as shown in stream events (special tokens by name)."""
        return self.hf.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


# Unicode normalizers that can only shorten text by composing characters, with the most code points they
# merge into one: a canonical decomposition has at most 4 (e.g. U+1F85, Greek alpha with three marks), so
# NFC and NFKC turn n characters into at least n / 4. Decompositions (NFD, NFKD) only lengthen text.
_NORMALIZER_SHRINK = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1}


def _max_chars_per_token(hf_tokenizer) -> int | None:
    """An upper bound on the input characters one token can stand for; None when the tokenizer allows none.

    In a byte-level BPE vocabulary (LLaDA's and Dream's) a token's string spells its bytes one character per
    byte, and a character is at least one byte, so a token covers at most len(token string) characters of
    the text it was cut from. A normalizer that composes characters shortens the text before that, by a
    bounded factor; one that can delete text (strip, replace, collapse whitespace) gives no bound at all.
    The engine uses this to refuse, without tokenizing, a prompt too long for any tokenization to fit.
    """
    import json

    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    shrink = _normalizer_shrink(json.loads(backend.to_str()).get("normalizer"))
    if shrink is None:
        return None
    longest = max((len(token) for token in hf_tokenizer.get_vocab()), default=0)
    return max(1, longest) * shrink


def _normalizer_shrink(normalizer: dict | None) -> int | None:
    if normalizer is None:
        return 1
    if normalizer.get("type") == "Sequence":
        factor = 1
        for step in normalizer.get("normalizers", []):
            step_factor = _normalizer_shrink(step)
            if step_factor is None:
                return None
            factor *= step_factor
        return factor
    return _NORMALIZER_SHRINK.get(normalizer.get("type"))
