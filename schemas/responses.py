"""Responses and server-sent-event chunks built from the engine's results, for both generation endpoints.

`ChunkBuilder` (chat) and `TextChunkBuilder` (legacy completions) share one base, `ResponseBuilder`, so
that the HTTP layer runs both endpoints through the same code: `completion(result)` is the whole response;
`start()`, `step(event)`, `finish(result)`, `usage(result)` are the stream's events in order.

Typed against the engine's `GenerationResult` and `StepEvent`, imported for type checkers only:
importing the engine at run time would load torch, which schemas never does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from schemas.chat import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    ChunkDelta,
    CommittedToken,
    ResolvedDiffusion,
    StepDiffusion,
    Usage,
)
from schemas.completions import TextChoice, TextCompletion
from schemas.errors import APIError

if TYPE_CHECKING:
    from engine.sampler import GenerationResult, StepEvent

SSE_DONE = "data: [DONE]\n\n"


def usage_of(result: GenerationResult) -> Usage:
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )


def resolved_diffusion(result: GenerationResult) -> ResolvedDiffusion:
    return ResolvedDiffusion.of(result.params, result.num_forward_passes)


def sse_event(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        # Fields that are None only on some chunk kinds (diffusion) are left out rather than sent as null.
        data = payload.model_dump(mode="json")
        if data.get("diffusion") is None:
            data.pop("diffusion", None)
        payload = data
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def step_diffusion(event: StepEvent, token_text: Callable[[int], str]) -> StepDiffusion:
    def tokens(pairs: list[tuple[int, int]]) -> list[CommittedToken]:
        return [
            CommittedToken(position=position, token_id=token_id, text=token_text(token_id))
            for position, token_id in pairs
        ]

    return StepDiffusion(
        step=event.step,
        block=event.block,
        committed=tokens(event.committed),
        edited=tokens(event.edited),
        masked_remaining=event.masked_remaining,
    )


class ResponseBuilder:
    """What both endpoints' builders share: the id, the stream's step, finish, usage and error events. A
    subclass says how its choices look (`_text_choice`, `_finish_choice`) and what envelope holds them
    (`_chunk`); `completion(result)` is its whole response."""

    ID_PREFIX = ""

    def __init__(self, request_id: str, created: int, model: str, token_text: Callable[[int], str]):
        self.id = f"{self.ID_PREFIX}-{request_id}"
        self.created = created
        self.model = model
        self.token_text = token_text

    def _chunk(self, choices: list[Any], **extra: Any) -> BaseModel:
        raise NotImplementedError

    def _text_choice(self, text: str) -> Any:
        """The choice of a step's chunk: the text that became final in it."""
        raise NotImplementedError

    def _finish_choice(self, finish_reason: str) -> Any:
        raise NotImplementedError

    def completion(self, result: GenerationResult) -> BaseModel:
        raise NotImplementedError

    def start(self) -> str | None:
        """The stream's opening event, if the endpoint has one."""
        return None

    def step(self, event: StepEvent) -> str:
        diffusion = step_diffusion(event, self.token_text)
        return sse_event(self._chunk([self._text_choice(event.text_delta)], diffusion=diffusion))

    def finish(self, result: GenerationResult) -> str:
        return sse_event(self._chunk([self._finish_choice(result.finish_reason)], diffusion=resolved_diffusion(result)))

    def usage(self, result: GenerationResult) -> str:
        return sse_event(self._chunk([], usage=usage_of(result)))

    @staticmethod
    def error(error: APIError) -> str:
        return sse_event(error.body())


class ChunkBuilder(ResponseBuilder):
    """One chat completion: the response, or its chunks in order: role, one per step, finish, [usage], [DONE]."""

    ID_PREFIX = "chatcmpl"

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def _text_choice(self, text: str) -> ChunkChoice:
        return ChunkChoice(delta=ChunkDelta(content=text))

    def _finish_choice(self, finish_reason: str) -> ChunkChoice:
        return ChunkChoice(delta=ChunkDelta(), finish_reason=finish_reason)

    def completion(self, result: GenerationResult) -> ChatCompletion:
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[Choice(message=AssistantMessage(content=result.text), finish_reason=result.finish_reason)],
            usage=usage_of(result),
            diffusion=resolved_diffusion(result),
        )

    def start(self) -> str | None:
        """The role chunk."""
        return sse_event(self._chunk([ChunkChoice(delta=ChunkDelta(role="assistant", content=""))]))


class TextChunkBuilder(ResponseBuilder):
    """One legacy text completion: the response, or its chunks in order: one per step, finish, [usage], [DONE].

    OpenAI's text completion chunks have no role chunk; each is a `text_completion` with `choices[0].text`.
    """

    ID_PREFIX = "cmpl"

    def _chunk(self, choices: list[TextChoice], **extra: Any) -> TextCompletion:
        return TextCompletion(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def _text_choice(self, text: str) -> TextChoice:
        return TextChoice(text=text, finish_reason=None)

    def _finish_choice(self, finish_reason: str) -> TextChoice:
        return TextChoice(text="", finish_reason=finish_reason)

    def completion(self, result: GenerationResult) -> TextCompletion:
        return self._chunk(
            [TextChoice(text=result.text, finish_reason=result.finish_reason)],
            usage=usage_of(result),
            diffusion=resolved_diffusion(result),
        )
