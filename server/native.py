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
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from api.errors import engine_error, sampling_params
from schemas.chat import ChatCompletionRequest, parse_chat_request
from schemas.errors import APIError
from schemas.knobs import native_argument

if TYPE_CHECKING:
    from engine import DiffusionEngine
    from engine.sampler import StepEvent

# BentoML's API takes the diffusion settings as plain arguments; None means "the default", as in the HTTP API.
Prompt = Annotated[str, Field(description="The user's message (the model's chat template is applied).")]
SystemPrompt = Annotated[str | None, Field(description="An optional system message.")]
# The knobs' annotations come from their definitions (engine.params, through schemas/knobs.py).
MaxTokens = native_argument("gen_length")
Steps = native_argument("num_denoising_steps")
BlockLength = native_argument("block_length")
Temperature = native_argument("temperature")
Seed = native_argument("seed")
LocalLeap = native_argument("use_local_leap")
KVCache = native_argument("kv_cache")
Threshold = native_argument("confidence_threshold")
EditingThreshold = native_argument("editing_threshold")  # LLaDA2.1's sampler (refused on other families)


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
    events = engine.astream(chat.engine_prompt(), sampling_params(chat, engine.sampler_defaults))
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
