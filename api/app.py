"""The OpenAI-compatible FastAPI app: routes, authentication, and the glue between schemas and engine.

The routes are thin: `schemas` validates the body and builds responses, chunks and errors; the engine
denoises; api/streaming.py moves the events. The engine is reached through `app.state.engine`, which the
host (service.py) sets once the model is loaded (None until then: a 503); the limits and the API key through
`app.state.settings`, the `ApiSettings` the app was created with (api/settings.py).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.docs import docs_router
from api.errors import client_gone, error_response, sampling_params
from api.landing import landing_router
from api.middleware import RequestContextMiddleware
from api.playground import playground_router
from api.settings import ApiSettings, key_matches
from api.streaming import first_event, last_result, read_body, sse_stream, until_disconnect
from schemas.chat import ChatCompletion, ModelCard, ModelList, parse_chat_request
from schemas.completions import TextCompletion, parse_completion_request
from schemas.errors import APIError
from schemas.openapi import (
    API_DESCRIPTION,
    BODY_ERRORS,
    CHAT_CHUNK_REF,
    CHAT_REQUEST_REF,
    COMMON_ERRORS,
    COMPLETION_REQUEST_REF,
    TEXT_CHUNK_REF,
    add_request_schemas,
    declare_api_key,
    error_responses,
    remove_validation_422,
)
from schemas.responses import ChunkBuilder, ResponseBuilder, TextChunkBuilder
from schemas.sampling import GenerationRequest

if TYPE_CHECKING:
    from engine import DiffusionEngine


# --- dependencies --------------------------------------------------------------------------------------


def app_settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def check_api_key(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> None:
    # The header is read by hand rather than through FastAPI's HTTPBearer, which would declare bearer auth
    # in the OpenAPI schema whether or not a key is set; the schema declares it only when one is (`openapi`).
    expected = app_settings(request).api_key
    if expected is None:
        return
    if not key_matches(authorization, expected):
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


# --- /v1 -------------------------------------------------------------------------------------------------

# The errors each route answers (schemas/openapi.py); the 401 is declared only while a key is set (`openapi`).
v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)], tags=["OpenAI-compatible"])


def model_card(request: Request, engine: DiffusionEngine) -> ModelCard:
    return ModelCard(
        id=engine.model_name,
        created=request.app.state.started_at,
        max_sequence_length=engine.max_sequence_length,
        quantization=engine.quantization,
        family=engine.family,
    )


@v1.get("/models", response_model=ModelList, responses=error_responses(*COMMON_ERRORS))
async def list_models(request: Request, engine: EngineDep) -> ModelList:
    """The one loaded model."""
    return ModelList(data=[model_card(request, engine)])


@v1.get(
    "/models/{model:path}",
    response_model=ModelCard,
    responses=error_responses(404, *COMMON_ERRORS),
)
async def retrieve_model(model: str, request: Request, engine: EngineDep) -> ModelCard:
    """The loaded model, if `model` is its id (what the OpenAI SDK's `models.retrieve` calls)."""
    if model != engine.model_name:
        raise APIError.model_not_found(model, engine.model_name)
    return model_card(request, engine)


# A message's "role" key: a key is the only JSON string followed by a colon. A "role" key elsewhere in the body
# (metadata) can only be counted once more per occurrence, and an escaped spelling not at all: the count is
# an estimate that errs low, except by such extra keys.
ROLE_KEY = re.compile(rb'"role"\s*:')


def check_message_count(body: bytes, max_messages: int | None) -> None:
    """Refuse a chat body with more messages than any prompt that fits can have, before parsing it: 20,000
    empty messages are a 580 KB body that takes the event loop a quarter of a second to validate, and they
    can only be refused in the end (each message adds template tokens). A count of a regular expression over
    the raw bytes costs a millisecond."""
    if max_messages is None:
        return
    count = len(ROLE_KEY.findall(body))
    if count > max_messages:
        raise APIError.invalid_value(
            "messages",
            f"The body has {count} messages; with this model's chat template no prompt of more than {max_messages} "
            "messages fits in the tokens a prompt may have (the model's context, or DLLM_MAX_PROMPT_TOKENS).",
        )


def _generation_route(path: str, response_model: type, chunk_ref: str, request_ref: str, what: str) -> Any:
    """`v1.post` for a generation endpoint: its JSON response or event stream, its errors, and its request body,
    declared by hand (the routes read their body themselves: a size limit, strict JSON)."""
    chunk_name = chunk_ref.rsplit("/")[-1]
    ok = {
        "description": f"A `{what}`, or with `stream: true` a `text/event-stream` of `data: <{chunk_name} JSON>` "
        "events (one per denoising step, then the finish chunk, [usage]) ending with `data: [DONE]`.",
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{response_model.__name__}"}},
            "text/event-stream": {
                "schema": {"type": "string", "description": "Server-sent events; each `data:` line is a chunk."},
                "x-sse-data-schema": {"$ref": chunk_ref},
            },
        },
    }
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": request_ref}}}}
    return v1.post(
        path,
        response_model=response_model,
        # 429: the engine's queue is full; 504: the service's response-start timeout (server/middleware.py).
        responses={200: ok, **error_responses(*BODY_ERRORS, 429, 504, *COMMON_ERRORS)},
        openapi_extra={"requestBody": body},
    )


@_generation_route("/chat/completions", ChatCompletion, CHAT_CHUNK_REF, CHAT_REQUEST_REF, "chat.completion")
async def create_chat_completion(request: Request, engine: EngineDep) -> Response:
    """Chat completion by diffusion (ADR 005, docs/adr/005-openai-compatible-api.md): the body is validated
    strictly, see the request schema."""
    body = await read_body(request, app_settings(request).max_request_bytes)
    check_message_count(body, engine.max_prompt_messages)
    chat = parse_chat_request(body)
    return await generate(request, engine, chat, ChunkBuilder)


@_generation_route("/completions", TextCompletion, TEXT_CHUNK_REF, COMPLETION_REQUEST_REF, "text_completion")
async def create_completion(request: Request, engine: EngineDep) -> Response:
    """Text completion by diffusion (OpenAI's legacy Completions): the prompt is raw text or token ids, given
    to the model without a chat template; every other field is the chat endpoint's (ADR 005)."""
    completion = parse_completion_request(await read_body(request, app_settings(request).max_request_bytes))
    return await generate(request, engine, completion, TextChunkBuilder)


async def generate(
    request: Request,
    engine: DiffusionEngine,
    generation: GenerationRequest,
    builder: type[ResponseBuilder],
) -> Response:
    """Both endpoints from a validated request on: engine events in, a response or an event stream out."""
    request.state.logged = generation.logged_fields()
    params = sampling_params(generation, engine.sampler_defaults)
    created = int(time.time())
    events = engine.astream(generation.engine_prompt(), params)

    # The first event is awaited before the response starts, so that what the engine rejects (a prompt
    # too long for the model, a full queue) still gets its HTTP status, also for streams.
    first = await first_event(request, events, generation)
    if first is None:
        return client_gone()  # the client left before the first step: nobody is listening
    chunks = builder(request.state.request_id, created, engine.model_name, engine.tokenizer.token_text)
    if not generation.stream:
        result = await until_disconnect(request, last_result(events, first))
        if result is None:
            await events.aclose()  # in case the task was cancelled before it could close them itself
            return client_gone()
        return JSONResponse(chunks.completion(result).model_dump(mode="json"))

    return StreamingResponse(
        sse_stream(events, first, chunks, generation.include_usage, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: dict[str, Any]) -> list[str]:
    """The methods that a route other than the catch-all takes at this request's path (empty: none)."""
    routes = [r for r in app.routes if getattr(r, "endpoint", None) is not unknown_route]
    return [
        method
        for method in HTTP_METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in routes)
    ]


async def unknown_route(request: Request) -> None:
    # Without this, BentoML answers unmatched paths itself, outside the OpenAI envelope. A known path with
    # another method is a 405 that says which methods it takes.
    allowed = allowed_methods(request.app, request.scope)
    if allowed:
        raise APIError.method_not_allowed(request.method, request.url.path, allowed)
    raise APIError.not_found(request.method, request.url.path)


# --- the app ---------------------------------------------------------------------------------------------


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, APIError)
    return error_response(error)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(APIError.not_found(request.method, request.url.path))
    if exc.status_code == 405:  # a method no route of the path takes (TRACE, a lowercase "post", ...)
        allowed = allowed_methods(request.app, request.scope)
        return error_response(APIError.method_not_allowed(request.method, request.url.path, allowed))
    return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


def create_app(settings: ApiSettings) -> FastAPI:
    """The app, with no engine yet: set `app.state.engine` once it is loaded. `settings` has no default on
    purpose: a host that forgot to pass the API key would otherwise serve an open API."""
    app = FastAPI(
        title="dllm-serve",
        summary="OpenAI-compatible serving for diffusion language models (LLaDA, Dream, DiffuCoder)",
        description=API_DESCRIPTION,
        version="0.1.0",
        docs_url=None,  # api/docs.py serves /docs and /redoc from local files
        redoc_url=None,
    )
    app.state.engine = None
    app.state.settings = settings
    app.state.started_at = int(time.time())  # `created` of the model card
    app.add_middleware(RequestContextMiddleware)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(v1)
    app.include_router(playground_router(serving_engine))
    app.include_router(docs_router)
    app.include_router(landing_router)
    app.add_api_route(
        "/v1/{path:path}",
        unknown_route,
        methods=list(HTTP_METHODS),
        include_in_schema=False,
    )
    schemas: dict[bool, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        # Bodies read by hand and stream chunks are added to the generated schema; bearer auth is declared
        # only while an API key is set (a schema that demands a key nobody checks misleads clients).
        with_key = app.state.settings.api_key is not None
        if with_key not in schemas:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            schema = remove_validation_422(add_request_schemas(schema))
            schemas[with_key] = declare_api_key(schema, prefix=v1.prefix) if with_key else schema
        return schemas[with_key]

    app.openapi = openapi  # type: ignore[method-assign]
    return app
