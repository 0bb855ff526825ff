"""The connection while a request runs: the body in, the engine's events out, the client leaving.

A request's life on the wire: `read_body` (bounded by the app's `max_request_bytes`), `first_event` (awaited
before the response starts, so the engine's refusals still get their status), then either
`last_result` (non-stream) or `sse_stream` (stream). `until_disconnect` races each wait against the
client's disconnect, so a client that leaves cancels its engine request and frees its batch slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TYPE_CHECKING, TypeVar

import anyio
from starlette.requests import Request

from api.errors import engine_error, stopped_engine_error
from schemas.errors import APIError
from schemas.responses import SSE_DONE, ResponseBuilder
from schemas.sampling import GenerationRequest

if TYPE_CHECKING:
    from engine.sampler import GenerationResult, StepEvent

logger = logging.getLogger(f"dllm_serve.{__name__}")
T = TypeVar("T")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed `limit` (from Content-Length, else while
    reading), so that an oversized upload is neither buffered nor parsed."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError.request_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError.request_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def first_event(
    request: Request, events: AsyncGenerator[StepEvent, None], generation: GenerationRequest
) -> StepEvent | None:
    """The request's first StepEvent (None if the client left first); the engine's refusals become HTTP errors."""
    try:
        first = await until_disconnect(request, anext(events))
    except Exception as error:
        api_error = engine_error(error, generation)
        if api_error is None:
            raise  # a server fault: RequestContextMiddleware logs it and answers 500
        raise api_error from None
    if first is None:
        await events.aclose()
    return first


async def last_result(events: AsyncGenerator[StepEvent, None], first: StepEvent) -> GenerationResult:
    """Drain the request's events; the last one carries its result."""
    try:
        event = first
        while not event.finished:
            event = await anext(events)
        assert event.result is not None  # set on every finished event
        return event.result
    except Exception as error:
        stopped = stopped_engine_error(error)
        if stopped is None:
            raise
        raise stopped from None
    finally:
        await events.aclose()


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read: the next message is http.disconnect, whenever the client goes away.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work`, cancelling it (and so the engine request) if the client disconnects first (→ None)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        request.state.disconnected = True
        await asyncio.gather(task, return_exceptions=True)  # let the engine request wind down
        return None
    return task.result()


async def sse_stream(
    events: AsyncGenerator[StepEvent, None],
    first: StepEvent,
    chunks: ResponseBuilder,
    include_usage: bool,
    request: Request,
) -> AsyncIterator[str]:
    """[role chunk (chat)], one chunk per denoising step, finish chunk, [usage chunk], [DONE].

    A client disconnect cancels this generator (CancelledError at a yield or await): closing `events`
    then cancels the engine request, freeing its batch slot at the next step.
    """
    try:
        opening = chunks.start()
        if opening is not None:
            yield opening
        event = first
        while True:
            yield chunks.step(event)
            if event.finished:
                break
            event = await anext(events)
        assert event.result is not None  # set on every finished event
        yield chunks.finish(event.result)
        if include_usage:
            yield chunks.usage(event.result)
    except asyncio.CancelledError:
        request.state.disconnected = True
        raise
    except Exception as error:  # after the 200 has gone out, an error can only travel inside the stream
        stopped = stopped_engine_error(error)
        if stopped is None:
            logger.exception("request %s failed mid-stream", request.state.request_id)
        yield chunks.error(stopped or APIError.internal(request.state.request_id))
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()
    yield SSE_DONE
