"""The engine behind BentoML's own API: the `@bentoml.api` methods in service.py (`generate`,
`generate_stream`), which BentoML's index page, `bentoml.SyncHTTPClient` and `AsyncHTTPClient` call.

They take a prompt (one user message, through the model's chat template) and the diffusion settings as
plain arguments, and go through exactly the validation of the OpenAI endpoints: the arguments become a
chat request body and `parse_chat_request` checks it, so both APIs accept and refuse the same values.
Errors, a request before the engine is loaded included (`not_ready`), are `APIError`s; service.py turns
them into BentoML's own error responses. The arguments' annotations (`Prompt`, `MaxTokens`, ...) are here
too: their descriptions are the API's documentation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from api.errors import engine_error, sampling_params
from schemas.chat import ChatCompletionRequest, parse_chat_request
from schemas.errors import APIError

if TYPE_CHECKING:
    from engine import DiffusionEngine
    from engine.sampler import StepEvent

# BentoML's API takes the diffusion settings as plain arguments; None means "the default", as in the HTTP API.
Prompt = Annotated[str, Field(description="The user's message (the model's chat template is applied).")]
SystemPrompt = Annotated[str | None, Field(description="An optional system message.")]
MaxTokens = Annotated[int | None, Field(description="The canvas size in tokens (default 128).")]
Steps = Annotated[int | None, Field(description="Denoising steps, 1–512 (default min(128, max_tokens)).")]
BlockLength = Annotated[int | None, Field(description="Tokens per block (default max_tokens: one block).")]
Temperature = Annotated[float | None, Field(description="0–2 (default 0: deterministic).")]
Seed = Annotated[int | None, Field(description="The random seed (used above temperature 0).")]
LocalLeap = Annotated[bool | None, Field(description="LocalLeap acceleration (default false).")]
KVCache = Annotated[Literal["none", "prefix", "dual"] | None, Field(description="Approximate KV cache.")]
Threshold = Annotated[float | None, Field(description="Threshold decoding: τ in (0, 1] (default off).")]


def chat_request(prompt: str, system_prompt: str | None, settings: dict[str, Any]) -> ChatCompletionRequest:
    """The prompt and the settings given (None: omitted) as a validated chat request."""
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}
    ]
    body = {"messages": messages, **{name: value for name, value in settings.items() if value is not None}}
    # Through JSON, so that the strict JSON rules of the HTTP API apply unchanged.
    return parse_chat_request(json.dumps(body).encode())


async def text_events(
    engine: DiffusionEngine | None, prompt: str, system_prompt: str | None, settings: dict[str, Any]
) -> AsyncIterator[StepEvent]:
    """The request's events; a refusal before the first one (no engine yet, invalid settings, the engine's own)
    is an `APIError`."""
    if engine is None:
        raise APIError.not_ready()
    chat = chat_request(prompt, system_prompt, settings)
    events = engine.astream(messages=chat.engine_messages(), params=sampling_params(chat))
    try:
        first = await anext(events)
    except Exception as error:
        api_error = engine_error(error, chat)
        if api_error is None:
            raise
        raise api_error from None
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()  # a client that leaves frees the batch slot at the next step


async def generate_text(engine: DiffusionEngine | None, prompt: str, system_prompt: str | None, **settings: Any) -> str:
    async for event in text_events(engine, prompt, system_prompt, settings):
        if event.finished:
            assert event.result is not None  # set on every finished event
            return event.result.text
    raise RuntimeError("the sampler stopped without finishing")  # unreachable: every canvas fills up


async def stream_text(
    engine: DiffusionEngine | None, prompt: str, system_prompt: str | None, **settings: Any
) -> AsyncIterator[str]:
    """The text as it becomes final, one piece per denoising step that finalised some (empty steps are skipped)."""
    async for event in text_events(engine, prompt, system_prompt, settings):
        if event.text_delta:
            yield event.text_delta
