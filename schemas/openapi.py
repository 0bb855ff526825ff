"""What the OpenAPI schema (and so /docs) shows besides the routes: the description, the request bodies,
the stream chunks, and bearer auth when a key is set.

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


def add_request_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Register the request bodies and the stream chunks, which no route declares as a Python type."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionRequest, ChatCompletionChunk, CompletionRequest, TextCompletion):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi


def declare_api_key(openapi: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of the schema that declares bearer auth on the operations under `prefix`."""
    openapi = {**openapi, "components": {**openapi["components"]}}
    openapi["components"]["securitySchemes"] = {
        BEARER_SCHEME: {"type": "http", "scheme": "bearer", "description": "The key the server was started with."}
    }
    paths = {}
    for path, item in openapi["paths"].items():
        if path.startswith(prefix + "/"):
            item = {method: {**op, "security": [{BEARER_SCHEME: []}]} for method, op in item.items()}
        paths[path] = item
    openapi["paths"] = paths
    return openapi
