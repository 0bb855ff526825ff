"""Tokenizer glue: chat template, special ids, and encoding that never lets user text become a special token.

A user who types "<|mdm_mask|>" must not create a masked position (the sampler would fill it), nor forge
a turn header. So the chat template is rendered with placeholders in place of each message's content;
the template's own text is encoded with special tokens parsed, and each content is encoded with special
tokens split into ordinary text.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from engine.config import LLADA_EOS_ID, LLADA_EOT_ID, LLADA_MASK_ID, LLaDAConfig

EOT_TOKEN = "<|eot_id|>"


class ChatTokenizer:
    def __init__(self, hf_tokenizer, mask_id: int, eos_id: int, eot_id: int):
        self.hf = hf_tokenizer
        self.mask_id = mask_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.stop_ids = frozenset({eos_id, eot_id})
        self._trims_content = self._template_trims_content()

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: LLaDAConfig | None = None) -> ChatTokenizer:
        from transformers import AutoTokenizer

        # trust_remote_code=False: LLaDA's config carries auto_map, and transformers 5 would otherwise ask
        # interactively whether to run the remote code. It then falls back to a plain tokenizer.
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # silence the "model of type llada" notice: we only load a tokenizer
        hf = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
        config = config or LLaDAConfig.from_file(Path(model_dir) / "config.json")
        mask_id = config.mask_token_id if config.mask_token_id is not None else LLADA_MASK_ID
        eos_id = config.eos_token_id if config.eos_token_id is not None else (hf.eos_token_id or LLADA_EOS_ID)
        eot_id = hf.convert_tokens_to_ids(EOT_TOKEN)
        if eot_id is None or eot_id == hf.unk_token_id:
            eot_id = LLADA_EOT_ID
        return cls(hf, mask_id=mask_id, eos_id=eos_id, eot_id=eot_id)

    def _render(self, messages: list[dict]) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _template_trims_content(self) -> bool:
        probe = f"\ue000{uuid.uuid4().hex}\ue001"
        return f" {probe} " not in self._render([{"role": "user", "content": f" {probe} "}])

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings inside `text` stay ordinary text."""
        return self.hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        placeholders = [f"\ue000{uuid.uuid4().hex}\ue001" for _ in messages]
        rendered = self._render([{**m, "content": p} for m, p in zip(messages, placeholders)])
        ids: list[int] = []
        start = 0  # an index, not a shrinking remainder string: copying the rest per message is quadratic
        for message, placeholder in zip(messages, placeholders):
            found = rendered.find(placeholder, start)
            if found < 0:
                raise ValueError("the chat template dropped a message; cannot tokenize this conversation safely")
            ids += self.hf(rendered[start:found], add_special_tokens=False)["input_ids"]
            content = message["content"]
            ids += self.encode_text(content.strip() if self._trims_content else content)
            start = found + len(placeholder)
        ids += self.hf(rendered[start:], add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The text of one token as shown in stream events (special tokens by name)."""
        return self.hf.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
