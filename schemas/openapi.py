"""What the OpenAPI schema (and so /docs) shows besides the routes: the description, the request bodies,
the stream chunks, the error responses each route really gives, and bearer auth (and its 401) when a key is set.

The generation routes read their bodies themselves (to control the error envelope and JSON strictness),
so FastAPI cannot infer the body schemas; stream chunks are not a Python return type either.
`add_request_schemas` registers them under components. The description's table of OpenAI fields is
generated from schemas/fields.py, like everything else about them.
"""

from __future__ import annotations

from typing import Any

from engine.params import DEFAULT_GEN_LENGTH
from schemas.chat import ChatCompletionChunk, ChatCompletionRequest
from schemas.completions import CompletionRequest, TextCompletion
from schemas.errors import ErrorResponse
from schemas.fields import OPENAI_FIELDS, Status
from schemas.knobs import EXTENSION_FIELDS

CHAT_REQUEST_REF = "#/components/schemas/ChatCompletionRequest"
CHAT_CHUNK_REF = "#/components/schemas/ChatCompletionChunk"
COMPLETION_REQUEST_REF = "#/components/schemas/CompletionRequest"
TEXT_CHUNK_REF = "#/components/schemas/TextCompletion"  # legacy stream chunks are `text_completion` objects too
BEARER_SCHEME = "bearer"

PAGE_LINKS = "[API reference](/docs) · [ReDoc](/redoc) · [models](/v1/models) · [playground](/playground)"


def _names(status: Status) -> str:
    names = dict.fromkeys(f.name for f in OPENAI_FIELDS if f.status == status)  # logprobs is in two rows
    return ", ".join(f"`{name}`" for name in names)


API_DESCRIPTION = f"""
{PAGE_LINKS}

OpenAI's Chat Completions and (legacy) Completions for **diffusion language models** (LLaDA, Dream, DiffuCoder),
following ADR 005 (`docs/adr/005-openai-compatible-api.md` in the dllm-serve repository: what is kept, changed,
added and refused, and why). Every OpenAI field is classified (full table in the README and docs/api.md):

| | |
|---|---|
| kept | {_names("kept")} |
| deviates | {_names("deviates")}: `max_tokens` / `max_completion_tokens` are the **canvas size** (default {DEFAULT_GEN_LENGTH}), not a stopping threshold; `temperature` omitted → **0**; `stream` sends **one chunk per denoising step** with the text that became final in it, plus a `diffusion` object |
| neutral values only (400 `unsupported_parameter` otherwise) | {_names("neutral")} |
| rejected (400 `unsupported_parameter`, citing ADR 005) | {_names("rejected")} |
| deprecated aliases (treated as their replacement) | {_names("deprecated alias")} |
| diffusion extension fields | {", ".join(f"`{name}`" for name in EXTENSION_FIELDS)}: top-level fields, see the request schemas |

To watch a completion's canvas denoise step by step in the browser, open [/playground](/playground).

Only fields OpenAI does not have are 400 `unknown_parameter`; nothing is silently ignored. Every error uses
OpenAI's envelope `{{"error": {{"message", "type", "param", "code"}}}}`. Every response carries `X-Request-ID`.
Authentication: none unless the server sets `DLLM_API_KEY` (then `Authorization: Bearer <key>` on `/v1`).
""".strip()  # noqa: E501 (markdown table rows)


# --- error responses -------------------------------------------------------------------------------------

RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
# Every error the routes can answer, in OpenAI's envelope (schemas/errors.py). FastAPI's own 422 is never sent:
# bad input is a 400 (`remove_validation_422` takes it out of the generated schema).
ERROR_RESPONSES: dict[int, dict[str, Any]] = {
    400: {
        "description": "Invalid request: `error.code` says what (`invalid_value`, `unsupported_parameter`, "
        "`unknown_parameter`, `missing_parameter`, `invalid_json`) and `error.param` which field."
    },
    401: {
        "description": "Missing or wrong API key (only while the server has DLLM_API_KEY set).",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    },
    404: {"description": "`model_not_found`: not the loaded model."},
    405: {
        "description": "`method_not_allowed`: this path with another method; the `Allow` header lists this one.",
        "headers": {"Allow": {"schema": {"type": "string"}}},
    },
    408: {
        "description": "`request_timeout`: the body did not arrive within DLLM_BODY_TIMEOUT_S; the connection "
        "is closed."
    },
    413: {"description": "`request_too_large`: the body exceeds DLLM_MAX_REQUEST_BYTES (default 2 MiB)."},
    415: {"description": "`unsupported_media_type`: a body not sent as `Content-Type: application/json`."},
    429: {"description": "`rate_limit_exceeded`: the request queue is full.", "headers": RETRY_AFTER},
    503: {
        "description": "`model_not_ready` (the model is loading), `shutting_down` (the server drains: another "
        "replica will answer) or `too_many_connections` (DLLM_MAX_CONNECTIONS).",
        "headers": RETRY_AFTER,
    },
    504: {"description": "`timeout`: no response had started within the service's traffic timeout (an hour)."},
}
# What every /v1 route can answer besides its own: a wrong method, and no model (loading, draining, full).
COMMON_ERRORS = (405, 503)
# What a POST with a body can answer before its route runs (server/middleware.py) or while reading the body.
BODY_ERRORS = (400, 408, 413, 415)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route (FastAPI's form) for these error statuses, each with the error envelope."""
    return {status: {"model": ErrorResponse, **ERROR_RESPONSES[status]} for status in sorted(statuses)}


def remove_validation_422(openapi: dict[str, Any]) -> dict[str, Any]:
    """The schema without FastAPI's automatic 422 `{"detail": [...]}`, which this server never sends."""
    for item in openapi["paths"].values():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
    schemas = openapi.get("components", {}).get("schemas", {})
    text = str(openapi["paths"])
    for name in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{name}'" not in text:
            schemas.pop(name, None)
    return openapi


def add_request_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Register the request bodies and the stream chunks, which no route declares as a Python type."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionRequest, ChatCompletionChunk, CompletionRequest, TextCompletion):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi


def declare_api_key(openapi: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of the schema that declares bearer auth, and its 401, on the operations under `prefix`."""
    openapi = {**openapi, "components": {**openapi["components"]}}
    openapi["components"]["securitySchemes"] = {
        BEARER_SCHEME: {"type": "http", "scheme": "bearer", "description": "The key the server was started with."}
    }
    paths = {}
    for path, item in openapi["paths"].items():
        if path.startswith(prefix + "/"):
            unauthorized = {"401": {"description": ERROR_RESPONSES[401]["description"], **_envelope(openapi, 401)}}
            item = {
                method: {**op, "security": [{BEARER_SCHEME: []}], "responses": {**op["responses"], **unauthorized}}
                for method, op in item.items()
            }
        paths[path] = item
    openapi["paths"] = paths
    return openapi


def _envelope(openapi: dict[str, Any], status: int) -> dict[str, Any]:
    """The OpenAPI response body and headers of an error status (the schema already has ErrorResponse)."""
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    headers = ERROR_RESPONSES[status].get("headers")
    return {"content": content, **({"headers": headers} if headers else {})}
