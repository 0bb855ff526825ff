"""BentoML's own API: the `@bentoml.api` methods in service.py (`generate`, `generate_stream`), which BentoML's
index page, `bentoml.SyncHTTPClient` and `AsyncHTTPClient` call, and what makes them answer like the rest of
the server.

They take a prompt (one user message, through the model's chat template) and the diffusion settings as
plain arguments, and go through exactly the validation of the OpenAI endpoints: the arguments become a
chat request body and `parse_chat_request` checks it, so both APIs accept and refuse the same values.
The arguments' annotations (`Prompt`, `MaxTokens`, ...) are here too: their descriptions are the API's
documentation.

BentoML's conventions, kept: a `str` result, and for the stream an async generator of `str` pieces that
BentoML sends as `text/event-stream` and its clients hand over piece by piece. Each piece is one
server-sent event, framed as BentoML's own `bentoml.io.SSE` frames them (its `SSE.from_iterator` reads them back):
`data:` the text that became final (one event per denoising step that finalised some), then `event: done`
with the finish reason, or `event: error` with the error envelope if the request fails mid-stream.

The server's conventions, added (`ErrorEnvelope`, installed by server/middleware.py's `RequestGuard`):
every error is the server's envelope (`{"error": {"message", "type", "param", "code"}}`, the status it
names), not BentoML's `[{"error": ...}]`; every response carries X-Request-ID and is logged once; a client
that leaves a non-stream request cancels it (a stream's disconnect already does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Annotated, Any

import bentoml
from bentoml.exceptions import BentoMLException
from pydantic import Field, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import (
    CLIENT_CLOSED_REQUEST,
    engine_error,
    error_response,
    sampling_params,
    stopped_engine_error,
)
from api.middleware import RequestContextMiddleware
from api.streaming import last_result, until_disconnect
from schemas.chat import ChatCompletionRequest, parse_chat_request
from schemas.errors import APIError
from schemas.knobs import native_argument

if TYPE_CHECKING:
    from engine import DiffusionEngine
    from engine.sampler import StepEvent

logger = logging.getLogger(f"dllm_serve.{__name__}")

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


def sse_event(data: str, event: str | None = None) -> str:
    """One server-sent event, framed exactly as BentoML's `bentoml.io.SSE(data, event).marshal()` frames it (a
    test pins that), without importing `bentoml.io`, which BentoML 1.4 deprecates: `data:` once per line of
    `data`, then a blank line. `SSE.from_iterator` (BentoML) or any SSE client reads it back."""
    lines = [f"event: {event}"] if event else []
    lines += [f"data: {line}" for line in data.split("\n")]
    return "\n".join(lines) + "\n\n"


# Where a refusal waits for `ErrorEnvelope` (in the request's ASGI state, shared by every layer).
REFUSAL_KEY = "refusal"


class Refused(BentoMLException):
    """Raised out of a BentoML API method (or its body read) for an `APIError`: BentoML turns it into its own
    error response, which `ErrorEnvelope` then replaces with the error's. Carries the error's status, so that
    even without the envelope the status is right."""

    def __init__(self, error: APIError):
        super().__init__(error.detail.message, error_code=HTTPStatus(error.status))
        self.error = error


def refuse(request: Request, error: APIError) -> Refused:
    """Remember `error` for the envelope and return the exception that carries it out of BentoML's endpoint."""
    request.scope.setdefault("state", {})[REFUSAL_KEY] = error
    return Refused(error)


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


async def final_text(events: AsyncGenerator[StepEvent, None]) -> str:
    """The answer's text, which the request's last event carries (`text_events` has already turned a refusal
    before the first event into an `APIError`)."""
    return (await last_result(events, await anext(events))).text


async def generate_text(
    engine: DiffusionEngine | None, ctx: bentoml.Context, prompt: str, system_prompt: str | None, **settings: Any
) -> str:
    """The answer; a refusal leaves as `Refused`. A client that leaves before the answer cancels the engine
    request (BentoML itself would let it run to the end), and is answered 499 (nobody reads it)."""
    request = ctx.request
    try:
        text = await until_disconnect(request, final_text(text_events(engine, prompt, system_prompt, settings)))
    except APIError as error:
        raise refuse(request, error) from None
    if text is None:
        ctx.response.status_code = CLIENT_CLOSED_REQUEST  # BentoML gives a method's response this status
        return ""
    return text


async def stream_text(
    engine: DiffusionEngine | None, ctx: bentoml.Context, prompt: str, system_prompt: str | None, **settings: Any
) -> AsyncIterator[str]:
    """The answer as server-sent events (the module docstring). A refusal before the first event leaves as
    `Refused`, so that it keeps its status; later, the stream can only carry it as an `error` event."""
    request = ctx.request
    events = text_events(engine, prompt, system_prompt, settings)
    try:
        first = await anext(events)
    except APIError as error:
        raise refuse(request, error) from None
    try:
        event = first
        while True:
            if event.text_delta:
                yield sse_event(event.text_delta)
            if event.finished:
                assert event.result is not None  # set on every finished event
                yield sse_event(json.dumps({"finish_reason": event.result.finish_reason}), event="done")
                return
            event = await anext(events)
    except Exception as error:  # after the 200 has gone out, an error can only travel inside the stream
        stopped = stopped_engine_error(error)
        if stopped is None:
            logger.exception("request %s failed mid-stream", request.state.request_id)
        failure = stopped or APIError.internal(request.state.request_id)
        yield sse_event(json.dumps(failure.body()), event="error")
    finally:
        await events.aclose()  # type: ignore[attr-defined]


# --- BentoML's error responses, in the server's envelope --------------------------------------------------


def error_from_bentoml(status: int, body: bytes, method: str, path: str) -> APIError:
    """The envelope for an error response BentoML wrote itself: its input validation (a 400 whose `detail`
    lists pydantic errors), its routing (404, 405), anything else by its status."""
    if status == 400:
        try:
            detail = json.loads(body).get("detail") or []
            first = detail[0]
            param = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
            return APIError.invalid_value(param, f"Invalid value for '{param}': {first['msg']}.")
        except (ValueError, AttributeError, LookupError, TypeError):
            return APIError.invalid_json("The request body could not be read as this API's arguments.")
    if status == 404:
        return APIError.not_found(method, path)
    if status == 405:
        return APIError.method_not_allowed(method, path, ["POST"])
    if status == 413:
        return APIError(413, "The request body is too large.", code="request_too_large")
    return APIError(
        status, HTTPStatus(status).phrase, type="server_error" if status >= 500 else "invalid_request_error"
    )


class ErrorEnvelope:
    """Around BentoML's app: error responses BentoML writes itself are replaced by the server's envelope.

    For BentoML's API routes (`every_error`), every error response: the error is the one a layer recorded
    under `REFUSAL_KEY` (a refusal from the API method, a body too large or too slow from `RequestGuard`'s
    receive), else the translation of BentoML's own body. Elsewhere, only BentoML's plain-text 404 and 405
    for a path no route takes (`//v1/models`, `/nothing`), answered with X-Request-ID; the mounted app's
    JSON errors and every successful response (streams included) pass through untouched.
    """

    def __init__(self, app: ASGIApp, every_error: bool):
        self.app = app
        self.every_error = every_error

    def _replaces(self, message: Message) -> bool:
        status = message["status"]
        if self.every_error:
            return status >= 400
        content_type = dict(message.get("headers", [])).get(b"content-type", b"")
        return status in (404, 405) and content_type.startswith(b"text/plain")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.setdefault("state", {})
        replaced: dict[str, Any] = {"status": None, "body": b""}

        async def send_in_envelope(message: Message) -> None:
            if message["type"] == "http.response.start" and self._replaces(message):
                replaced["status"] = message["status"]
                return
            if replaced["status"] is None:
                await send(message)
                return
            if message["type"] != "http.response.body":
                return
            replaced["body"] += message.get("body", b"")
            if message.get("more_body", False):
                return
            error = state.get(REFUSAL_KEY)
            if error is None:
                error = error_from_bentoml(replaced["status"], replaced["body"], scope["method"], scope["path"])
            response = error_response(error)
            # BentoML's API routes are inside RequestContextMiddleware already (server/middleware.py).
            await (response if self.every_error else RequestContextMiddleware(response))(scope, receive, send)

        await self.app(scope, receive, send_in_envelope)


class SkipClientErrorTracebacks(logging.Filter):
    """Drops BentoML's `Exception on /generate [POST]` tracebacks for a client's mistake (a refusal, invalid
    arguments): the request line (api/middleware.py) logs those at INFO, with the status. A server fault keeps
    its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, (Refused, APIError, ValidationError))


def install_log_filter() -> None:
    bentoml_errors = logging.getLogger("bentoml._internal.server.http_app")  # where BentoML's log_exception logs
    if not any(isinstance(f, SkipClientErrorTracebacks) for f in bentoml_errors.filters):
        bentoml_errors.addFilter(SkipClientErrorTracebacks())
