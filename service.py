"""The BentoML service: loads the diffusion engine on startup and serves the OpenAI-compatible API at "/".

This is the only module where the engine, the schemas and the web frameworks meet. The routes are thin:
`schemas` validates the body and builds responses, chunks and errors; `engine` denoises. torch is
imported lazily (inside startup and the routes) so that `bentoml build`, which imports this file, stays
cheap.

Configuration (environment): DLLM_MODEL (a local directory or hub id; default: the embedded
models/tiny-llada-chat), DLLM_DEVICE (default cuda when available), DLLM_DTYPE (default bfloat16 on CUDA,
float32 on CPU), DLLM_MAX_BATCH_SIZE / DLLM_MAX_WAITING / DLLM_MAX_WAIT_MS (the engine's scheduler),
DLLM_API_KEY (when set, /v1 requires `Authorization: Bearer <key>`), DLLM_COMPILE (1: torch.compile the
model's blocks), DLLM_MAX_REQUEST_BYTES (default 2 MiB), DLLM_LOG_LEVEL (default INFO).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import bentoml
import bentoml.exceptions
from bentoml._internal.server.http import traffic as bentoml_traffic
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.chat import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList, parse_chat_request
from schemas.errors import APIError, ErrorResponse
from schemas.openapi import API_DESCRIPTION, CHAT_CHUNK_REF, CHAT_REQUEST_REF, add_chat_schemas
from schemas.request_id import REQUEST_ID_HEADER, is_valid_request_id, new_request_id
from schemas.responses import SSE_DONE, ChunkBuilder, chat_completion

if TYPE_CHECKING:
    from engine import DiffusionEngine, SamplingParams

logger = logging.getLogger("dllm_serve")
T = TypeVar("T")

OVERLOAD_RETRY_AFTER_S = 1
# A LLaDA-8B prompt fits in 4,096 tokens, a few hundred KB of JSON at most: a bigger body cannot be served,
# and reading and tokenizing it would only cost time.
DEFAULT_MAX_REQUEST_BYTES = 2 * 2**20


def max_request_bytes() -> int:
    """DLLM_MAX_REQUEST_BYTES, else the default; checked at startup, read per request like the API key."""
    raw = os.environ.get("DLLM_MAX_REQUEST_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_REQUEST_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"DLLM_MAX_REQUEST_BYTES must be a positive integer (bytes), got {raw!r}")
    return int(raw)


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


def error_response(error: APIError) -> JSONResponse:
    # X-Request-ID is added by RequestContextMiddleware, like on every other response.
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


# --- request context: X-Request-ID, the request log line, last-resort 500s -----------------------------


class RequestContextMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would buffer streams and hide client disconnects).

    Assigns the request id (the client's, validated, or a new UUIDv7), puts it in `request.state`, adds
    it to every response (streams included), logs one line per request when it ends, and turns an
    unhandled exception into a 500 in the OpenAI envelope if no response has started yet.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        response: dict[str, Any] = {"status": None}

        sent_id = Headers(scope=scope).get(REQUEST_ID_HEADER)
        request_id = sent_id if sent_id is not None and is_valid_request_id(sent_id) else new_request_id()
        state["request_id"] = request_id

        async def send_with_request_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            if sent_id is not None and sent_id != request_id:
                error = APIError.invalid_value(
                    REQUEST_ID_HEADER,
                    f"Invalid {REQUEST_ID_HEADER} header: it must be 1–128 printable ASCII characters without "
                    f"spaces. This response carries a generated id ({request_id}) instead.",
                )
                await error_response(error)(scope, receive, send_with_request_id)
            else:
                await self.app(scope, receive, send_with_request_id)
        except ClientDisconnect:  # the client left while the body was read or the stream written
            state["disconnected"] = True
            if response["status"] is None:
                # Nobody will read it, but the exchange must end with a response: BentoML's timeout
                # middleware waits for the first one (up to traffic.timeout), and that pending task would
                # also hold up the server's shutdown.
                await Response(status_code=499)(scope, receive, send_with_request_id)
        except Exception:
            logger.exception("request %s failed", request_id)
            if response["status"] is not None:
                raise  # mid-response: nothing left to tell the client
            await error_response(APIError.internal(request_id))(scope, receive, send_with_request_id)
        finally:
            logger.info(
                '"%s %s" %s %.0fms request_id=%s%s%s',
                scope["method"],
                scope["path"],
                response["status"],
                (time.perf_counter() - started) * 1000,
                request_id,
                f" user={state['user']!r}" if state.get("user") else "",
                " (client disconnected)" if state.get("disconnected") else "",
            )


# --- the FastAPI app ---------------------------------------------------------------------------------

app = FastAPI(
    title="dllm-serve",
    summary="OpenAI-compatible serving for diffusion language models (LLaDA)",
    description=API_DESCRIPTION,
    version="0.1.0",
)
app.add_middleware(RequestContextMiddleware)


def _openapi() -> dict:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, description=app.description, routes=app.routes
        )
        app.openapi_schema = add_chat_schemas(schema)
    return app.openapi_schema


app.openapi = _openapi


@app.exception_handler(APIError)
async def _api_error(request: Request, error: APIError) -> JSONResponse:
    return error_response(error)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return error_response(APIError.not_found(request.method, request.url.path))
    if exc.status_code == 405:
        return error_response(APIError.method_not_allowed(request.method, request.url.path))
    return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


_bearer = HTTPBearer(auto_error=False, description="Required only when the server sets DLLM_API_KEY.")


def check_api_key(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    # Read per request so that the key can be rotated by restarting with a new environment only.
    expected = os.environ.get("DLLM_API_KEY")
    if not expected:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise APIError.invalid_api_key()


def serving_engine() -> DiffusionEngine:
    try:
        service = bentoml.get_current_service()
    except bentoml.exceptions.BentoMLException:
        raise APIError.not_ready() from None
    if service.engine is None:
        raise APIError.not_ready()
    return service.engine


EngineDep = Annotated[Any, Depends(serving_engine)]  # a DiffusionEngine (torch is not imported at module level)

_ERRORS = {
    400: {"model": ErrorResponse, "description": "Invalid request (see `error.code` and `error.param`)."},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (only when DLLM_API_KEY is set)."},
    429: {"model": ErrorResponse, "description": "The request queue is full; see `Retry-After`."},
}

v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)], tags=["OpenAI-compatible"])


def model_card(engine: DiffusionEngine) -> ModelCard:
    return ModelCard(id=engine.model_name, created=_STARTED_AT, max_sequence_length=engine.max_sequence_length)


@v1.get("/models", response_model=ModelList, responses=_ERRORS)
async def list_models(engine: EngineDep) -> ModelList:
    """The one loaded model."""
    return ModelList(data=[model_card(engine)])


@v1.get(
    "/models/{model:path}",
    response_model=ModelCard,
    responses={404: {"model": ErrorResponse, "description": "Not the loaded model."}, **_ERRORS},
)
async def retrieve_model(model: str, engine: EngineDep) -> ModelCard:
    """The loaded model, if `model` is its id (what the OpenAI SDK's `models.retrieve` calls)."""
    if model != engine.model_name:
        raise APIError.model_not_found(model, engine.model_name)
    return model_card(engine)


@v1.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={
        200: {
            "description": "A `chat.completion`, or with `stream: true` a `text/event-stream` of "
            "`chat.completion.chunk`s: role, one per denoising step, finish, [usage], `[DONE]`.",
            "content": {"text/event-stream": {"schema": {"$ref": CHAT_CHUNK_REF}}},
        },
        413: {"model": ErrorResponse, "description": "The body exceeds DLLM_MAX_REQUEST_BYTES (default 2 MiB)."},
        **_ERRORS,
    },
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": CHAT_REQUEST_REF}}}}
    },
)
async def create_chat_completion(request: Request, engine: EngineDep) -> Response:
    """Chat completion by diffusion (ADR 005): the body is validated strictly, see the request schema."""
    chat = parse_chat_request(await read_body(request, max_request_bytes()))
    request.state.user = chat.user
    params = sampling_params(chat)
    request_id = request.state.request_id
    created = int(time.time())
    events = engine.astream(messages=chat.engine_messages(), params=params)

    # The first event is awaited before the response starts, so that what the engine rejects (a prompt
    # too long for the model, a full queue) still gets its HTTP status, also for streams.
    first = await first_event(request, events, chat)
    if first is None:
        return Response(status_code=499)  # the client left before the first step: nobody is listening
    if not chat.stream:
        result = await until_disconnect(request, _last_result(events, first))
        if result is None:
            await events.aclose()  # in case the task was cancelled before it could close them itself
            return Response(status_code=499)
        return JSONResponse(chat_completion(request_id, created, engine.model_name, result).model_dump(mode="json"))

    chunks = ChunkBuilder(request_id, created, engine.model_name, engine.tokenizer.token_text)
    include_usage = chat.stream_options is not None and bool(chat.stream_options.include_usage)
    return StreamingResponse(
        sse_stream(events, first, chunks, include_usage, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


app.include_router(v1)


@app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def unknown_route(request: Request) -> None:
    # Without this, BentoML answers unmatched paths itself, outside the OpenAI envelope.
    raise APIError.not_found(request.method, request.url.path)


# --- glue between the schemas and the engine ----------------------------------------------------------


def sampling_params(chat: ChatCompletionRequest) -> SamplingParams:
    from engine import InvalidParameter, SamplingParams

    try:
        return SamplingParams(**chat.sampling_kwargs())
    except InvalidParameter as error:
        raise invalid_parameter_error(error, chat) from None


def invalid_parameter_error(error: Any, chat: ChatCompletionRequest) -> APIError:
    """An engine InvalidParameter, reported under the request field the client sent."""
    param = chat.http_param(error.field)
    message = f"Invalid value for '{param}': {error.rule}"
    if error.field != "gen_length" and "gen_length" in error.rule:
        message += f"; gen_length is the canvas size, set by {chat.canvas_field} (default 128)"
    return APIError.invalid_value(param, message.rstrip(".") + ".")


def engine_error(error: Exception, chat: ChatCompletionRequest) -> APIError | None:
    """The HTTP error for what the engine raises before a request's first event (None: a server fault)."""
    from engine import EngineOverloaded, EngineShutdown, InvalidParameter

    if isinstance(error, InvalidParameter):
        return invalid_parameter_error(error, chat)
    if isinstance(error, EngineOverloaded):
        logger.warning("rejected with 429: %s", error)
        return APIError.overloaded(OVERLOAD_RETRY_AFTER_S)
    if isinstance(error, EngineShutdown):
        return APIError(503, "The server is shutting down.", type="server_error", code="shutting_down")
    if isinstance(error, ValueError):  # the engine's other input errors carry a message a user can act on
        return APIError.invalid_value(None, str(error))
    return None


async def first_event(request: Request, events: AsyncIterator[Any], chat: ChatCompletionRequest) -> Any:
    """The request's first StepEvent (None if the client left first); the engine's refusals become HTTP errors."""
    try:
        first = await until_disconnect(request, anext(events))
    except Exception as error:
        api_error = engine_error(error, chat)
        if api_error is None:
            raise
        raise api_error from None
    if first is None:
        await events.aclose()
    return first


async def _last_result(events: AsyncIterator[Any], first: Any) -> Any:
    try:
        event = first
        while not event.finished:
            event = await anext(events)
        return event.result
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
    events: AsyncIterator[Any], first: Any, chunks: ChunkBuilder, include_usage: bool, request: Request
) -> AsyncIterator[str]:
    """role chunk, one chunk per denoising step, finish chunk, [usage chunk], [DONE].

    A client disconnect cancels this generator (CancelledError at a yield or await): closing `events`
    then cancels the engine request, freeing its batch slot at the next step.
    """
    try:
        yield chunks.role()
        event = first
        while True:
            yield chunks.step(event)
            if event.finished:
                break
            event = await anext(events)
        yield chunks.finish(event.result)
        if include_usage:
            yield chunks.usage(event.result)
    except asyncio.CancelledError:
        request.state.disconnected = True
        raise
    except Exception:  # after the 200 has gone out, an error can only travel inside the stream
        logger.exception("request %s failed mid-stream", request.state.request_id)
        yield chunks.error(APIError.internal(request.state.request_id))
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()
    yield SSE_DONE


# --- the BentoML service -------------------------------------------------------------------------------


class ResponseStartTimeout:
    """`traffic.timeout` as BentoML 1.4 means it (a 504 if no response has started in time), minus a leak.

    BentoML's TimeoutMiddleware arms a timer per request and never cancels it, so every finished request
    stays referenced by its timer, with its context and tracing span (~7 KB), for the whole timeout: an
    hour here (see `traffic` below). This version waits with `asyncio.wait`, whose timer is cancelled.
    """

    def __init__(self, app: ASGIApp, timeout: float):
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = asyncio.Event()

        async def send_and_mark(message: Message) -> None:
            started.set()
            await send(message)

        app = asyncio.ensure_future(self.app(scope, receive, send_and_mark))
        start_seen = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({app, start_seen}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            start_seen.cancel()
        if not started.is_set() and not app.done():
            app.cancel()
            error = APIError(504, f"No response within {self.timeout:g} s.", type="server_error", code="timeout")
            await error_response(error)(scope, receive, send)
            return
        await app


# BentoML builds its middleware stack from this module attribute when the app is created (after this import).
bentoml_traffic.TimeoutMiddleware = ResponseStartTimeout

_STARTED_AT = int(time.time())


@bentoml.asgi_app(app, path="/")
@bentoml.service(
    name="dllm-serve",
    # One process owns the model and batches inside it; scale out with replicas, not workers.
    workers=1,
    # The timeout ends at the response headers (ResponseStartTimeout): a long non-stream generation must not
    # be cut by a 504. The engine's bounded queue (429) is the overload protection.
    traffic={"timeout": 3600, "concurrency": 32},
    resources={"gpu": 1},  # deployment target; on a CPU-only machine BentoML only warns
)
class DiffusionLLMService:
    def __init__(self) -> None:
        self.engine: DiffusionEngine | None = None

    @bentoml.on_startup
    def load_engine(self) -> None:
        # Before torch loads: OpenMP reads its environment once. CPU threads only run the model on a CPU; on a
        # GPU they run small host-side ops. With OpenMP's spinning workers, a request took 0.5-16 s instead
        # of 0.1 s when another torch process shared the cores; one thread is immune to that and,
        # for the embedded model, also faster than several sleeping (PASSIVE) ones: benchmarks/cpu_threads.py.
        # A large model on a many-core CPU wants OMP_NUM_THREADS=<cores>: PASSIVE then keeps it safe.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from engine import DiffusionEngine

        max_request_bytes()  # a bad DLLM_MAX_REQUEST_BYTES fails the start, not every request

        # BentoML's logging config disables loggers created before it and keeps the root at WARNING: without
        # this, the request lines (INFO) would be dropped.
        logger.disabled = False
        logger.setLevel(os.environ.get("DLLM_LOG_LEVEL", "INFO").upper())

        model = os.environ.get("DLLM_MODEL") or None
        device = os.environ.get("DLLM_DEVICE") or None
        dtype = os.environ.get("DLLM_DTYPE") or None
        started = time.perf_counter()
        engine = DiffusionEngine.from_pretrained(model, device=device, dtype=dtype)
        logger.info(
            "loaded %s on %s (%s) in %.1fs; scheduler %s",
            engine.model_name,
            engine.device,
            next(engine.model.parameters()).dtype,
            time.perf_counter() - started,
            engine.scheduler_config,
        )
        self.engine = engine

    def __is_ready__(self) -> bool:
        return self.engine is not None

    def __metrics__(self, text: str) -> str:
        if self.engine is None:
            return text
        return text + self.engine.stats.prometheus_text()

    @bentoml.on_shutdown
    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
