"""The OpenAI-compatible FastAPI app: routes, authentication, and the glue between schemas and engine.

The routes are thin: `schemas` validates the body and builds responses, chunks and errors; the engine
denoises; api/streaming.py moves the events. The engine is reached through `app.state.engine`, which the
BentoML service sets once the model is loaded (None until then: a 503).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import client_gone, error_response, invalid_parameter_error
from api.middleware import RequestContextMiddleware
from api.playground import playground_router
from api.streaming import first_event, last_result, max_request_bytes, read_body, sse_stream, until_disconnect
from schemas.chat import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList, parse_chat_request
from schemas.errors import APIError, ErrorResponse
from schemas.openapi import API_DESCRIPTION, CHAT_CHUNK_REF, CHAT_REQUEST_REF, add_chat_schemas
from schemas.responses import ChunkBuilder, chat_completion

if TYPE_CHECKING:
    from engine import DiffusionEngine, SamplingParams


# --- dependencies --------------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="Required only when the server sets DLLM_API_KEY.")


def check_api_key(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    # Read per request so that the key can be rotated by restarting with a new environment only.
    expected = os.environ.get("DLLM_API_KEY")
    if not expected:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise APIError.invalid_api_key()


def serving_engine(request: Request) -> DiffusionEngine:
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        raise APIError.not_ready()
    return engine


if TYPE_CHECKING:
    EngineDep = DiffusionEngine
else:  # FastAPI resolves this at run time, where the engine's classes are not imported (they load torch)
    EngineDep = Annotated[Any, Depends(serving_engine)]


def sampling_params(chat: ChatCompletionRequest) -> SamplingParams:
    from engine import InvalidParameter, SamplingParams

    try:
        return SamplingParams(**chat.sampling_kwargs())
    except InvalidParameter as error:
        raise invalid_parameter_error(error, chat) from None


# --- /v1 -------------------------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request (see `error.code` and `error.param`)."},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (only when DLLM_API_KEY is set)."},
    429: {"model": ErrorResponse, "description": "The request queue is full; see `Retry-After`."},
}

v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)], tags=["OpenAI-compatible"])


def model_card(request: Request, engine: DiffusionEngine) -> ModelCard:
    return ModelCard(
        id=engine.model_name, created=request.app.state.started_at, max_sequence_length=engine.max_sequence_length
    )


@v1.get("/models", response_model=ModelList, responses=_ERRORS)
async def list_models(request: Request, engine: EngineDep) -> ModelList:
    """The one loaded model."""
    return ModelList(data=[model_card(request, engine)])


@v1.get(
    "/models/{model:path}",
    response_model=ModelCard,
    responses={404: {"model": ErrorResponse, "description": "Not the loaded model."}, **_ERRORS},
)
async def retrieve_model(model: str, request: Request, engine: EngineDep) -> ModelCard:
    """The loaded model, if `model` is its id (what the OpenAI SDK's `models.retrieve` calls)."""
    if model != engine.model_name:
        raise APIError.model_not_found(model, engine.model_name)
    return model_card(request, engine)


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
    """Chat completion by diffusion (ADR 005, docs/adr/005-openai-compatible-api.md): the body is validated
    strictly, see the request schema."""
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
        return client_gone()  # the client left before the first step: nobody is listening
    if not chat.stream:
        result = await until_disconnect(request, last_result(events, first))
        if result is None:
            await events.aclose()  # in case the task was cancelled before it could close them itself
            return client_gone()
        return JSONResponse(chat_completion(request_id, created, engine.model_name, result).model_dump(mode="json"))

    chunks = ChunkBuilder(request_id, created, engine.model_name, engine.tokenizer.token_text)
    include_usage = chat.stream_options is not None and bool(chat.stream_options.include_usage)
    return StreamingResponse(
        sse_stream(events, first, chunks, include_usage, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def unknown_route(request: Request) -> None:
    # Without this, BentoML answers unmatched paths itself, outside the OpenAI envelope.
    raise APIError.not_found(request.method, request.url.path)


# --- the app ---------------------------------------------------------------------------------------------


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, APIError)
    return error_response(error)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(APIError.not_found(request.method, request.url.path))
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")  # set by the router: the methods the route has
        return error_response(APIError.method_not_allowed(request.method, request.url.path, allowed))
    return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


def create_app() -> FastAPI:
    """The app, with no engine yet: set `app.state.engine` once it is loaded."""
    app = FastAPI(
        title="dllm-serve",
        summary="OpenAI-compatible serving for diffusion language models (LLaDA)",
        description=API_DESCRIPTION,
        version="0.1.0",
    )
    app.state.engine = None
    app.state.started_at = int(time.time())  # `created` of the model card
    app.add_middleware(RequestContextMiddleware)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(v1)
    app.include_router(playground_router(serving_engine))
    app.add_api_route(
        "/v1/{path:path}", unknown_route, methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
    )

    def openapi() -> dict[str, Any]:
        # The chat route reads its body itself: its request schema and the stream chunk are added by hand.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = add_chat_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
