"""`Prompt`: what a request asks the model to continue, as one typed value.

A prompt is chat messages (rendered with the model's chat template), raw text (no template), or token ids.
It is built once, where a request enters (the HTTP schemas, or the Python API's keywords), and its shape is
checked there, once: which of the three it is, that messages have a role and string content, that text is
a string. What needs the loaded model (the vocabulary, the mask id, the sequence length) is the engine's to
check, when it measures and tokenizes the prompt (`DiffusionEngine.check_prompt_size`, `prompt_ids`).
No torch here: the HTTP schemas build prompts too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import InvalidParameter

CHAT_ROLES = ("system", "user", "assistant")
PromptKind = Literal["messages", "text", "token_ids"]
# The parameter an error about the prompt names: the Python API's keyword for each kind.
FIELD_OF: dict[PromptKind, str] = {"messages": "messages", "text": "prompt", "token_ids": "prompt_token_ids"}


@dataclass(frozen=True)
class Prompt:
    """One request's prompt. Build it with `chat`, `text` or `token_ids` (or `of`, from the API's keywords)."""

    kind: PromptKind
    value: Any  # tuple of message dicts, str, or a sequence of token ids (checked by the engine)

    @classmethod
    def chat(cls, messages: Sequence[dict]) -> Prompt:
        """Chat messages, each `{"role": "system" | "user" | "assistant", "content": str}`."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidParameter("messages", f"each message needs a role in {CHAT_ROLES} and string content")
        if not messages:
            raise InvalidParameter("messages", "must contain at least one message")
        for message in messages:
            if (
                not isinstance(message, dict)
                or message.get("role") not in CHAT_ROLES
                or not isinstance(message.get("content"), str)
            ):
                raise InvalidParameter("messages", f"each message needs a role in {CHAT_ROLES} and string content")
        return cls("messages", tuple(messages))

    @classmethod
    def text(cls, text: str) -> Prompt:
        """Raw text, given to the model as is: no chat template, special-token text in it stays plain text."""
        if not isinstance(text, str):
            raise InvalidParameter("prompt", "must be a string")
        return cls("text", text)

    @classmethod
    def token_ids(cls, ids: Sequence[int]) -> Prompt:
        """Token ids, given to the model as they are. Each id is checked against the model's vocabulary when the
        engine prepares the request (off the event loop for the async API: a list can be long)."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
            raise InvalidParameter("prompt_token_ids", "must be a list of integer token ids")
        return cls("token_ids", ids)

    @classmethod
    def of(
        cls,
        prompt: Prompt | str | None = None,
        *,
        messages: Sequence[dict] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> Prompt:
        """The prompt of a Python API call: a `Prompt`, raw text, or the `messages=` / `prompt_token_ids=`
        keyword; exactly one of them."""
        if sum(x is not None for x in (prompt, messages, prompt_token_ids)) != 1:
            raise ValueError("pass exactly one of messages=, prompt_token_ids= or prompt=")
        if messages is not None:
            return cls.chat(messages)
        if prompt_token_ids is not None:
            return cls.token_ids(prompt_token_ids)
        if isinstance(prompt, Prompt):
            return prompt
        return cls.text(prompt)  # type: ignore[arg-type] (a non-string is refused there, naming `prompt`)

    @property
    def field(self) -> str:
        """The parameter that an error about this prompt names."""
        return FIELD_OF[self.kind]

    @property
    def messages(self) -> list[dict]:
        assert self.kind == "messages"
        return list(self.value)
