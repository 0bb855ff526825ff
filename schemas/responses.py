"""Responses and server-sent-event chunks built from the engine's results.

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
from schemas.errors import APIError

if TYPE_CHECKING:
    from engine.sampler import GenerationResult, StepEvent

SSE_DONE = "data: [DONE]\n\n"


def completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def usage_of(result: GenerationResult) -> Usage:
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )


def chat_completion(request_id: str, created: int, model: str, result: GenerationResult) -> ChatCompletion:
    return ChatCompletion(
        id=completion_id(request_id),
        created=created,
        model=model,
        choices=[Choice(message=AssistantMessage(content=result.text), finish_reason=result.finish_reason)],
        usage=usage_of(result),
        diffusion=ResolvedDiffusion.of(result.params, result.num_forward_passes),
    )


def sse_event(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        # Fields that are None only on some chunk kinds (diffusion) are left out rather than sent as null.
        data = payload.model_dump(mode="json")
        if data.get("diffusion") is None:
            data.pop("diffusion", None)
        payload = data
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ChunkBuilder:
    """The chunks of one streamed completion, in order: role, one per step, finish, [usage], [DONE]."""

    def __init__(self, request_id: str, created: int, model: str, token_text: Callable[[int], str]):
        self.id = completion_id(request_id)
        self.created = created
        self.model = model
        self.token_text = token_text

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def role(self) -> str:
        return sse_event(self._chunk([ChunkChoice(delta=ChunkDelta(role="assistant", content=""))]))

    def step(self, event: StepEvent) -> str:
        diffusion = StepDiffusion(
            step=event.step,
            block=event.block,
            committed=[
                CommittedToken(position=position, token_id=token_id, text=self.token_text(token_id))
                for position, token_id in event.committed
            ],
            masked_remaining=event.masked_remaining,
        )
        return sse_event(self._chunk([ChunkChoice(delta=ChunkDelta(content=event.text_delta))], diffusion=diffusion))

    def finish(self, result: GenerationResult) -> str:
        return sse_event(
            self._chunk(
                [ChunkChoice(delta=ChunkDelta(), finish_reason=result.finish_reason)],
                diffusion=ResolvedDiffusion.of(result.params, result.num_forward_passes),
            )
        )

    def usage(self, result: GenerationResult) -> str:
        return sse_event(self._chunk([], usage=usage_of(result)))

    @staticmethod
    def error(error: APIError) -> str:
        return sse_event(error.body())
