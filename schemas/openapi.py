"""What FastAPI's /docs shows besides the routes: the API's description and the request body schema.

The chat route reads its body itself (to control the error envelope and JSON strictness), so FastAPI
cannot infer the body schema; stream chunks are not a Python return type either. `add_chat_schemas`
registers both under components.
"""

from __future__ import annotations

from schemas.chat import ChatCompletionChunk, ChatCompletionRequest

CHAT_REQUEST_REF = "#/components/schemas/ChatCompletionRequest"
CHAT_CHUNK_REF = "#/components/schemas/ChatCompletionChunk"

API_DESCRIPTION = """
An OpenAI Chat Completions–compatible API for **diffusion language models** (LLaDA, Dream, DiffuCoder), following ADR 005
(`docs/adr/005-openai-compatible-api.md` in the dllm-serve repository: what is kept, changed, added and refused, and why).

**Diffusion vs OpenAI semantics** (full table in the README and docs/api.md):

| | |
|---|---|
| kept | `messages` (system/user/assistant), `model` (ignored), `temperature`, `seed`, `stream`, `stream_options`, `stop`, `user`, `X-Request-ID` |
| deviates | `max_tokens` is the **canvas size** (`gen_length`, default 128), not a stopping threshold; `temperature` omitted → **0**; `stream` sends **one chunk per denoising step** with the text that became final in that step (jumps of several tokens), plus a `diffusion` object |
| rejected (400, ADR 005) | `top_p`, `top_k` > 1, `presence_penalty`, `frequency_penalty`, `n` > 1, `logit_bias`, `tools`, `tool_choice`, `functions`, `function_call`, `logprobs: true`, `top_logprobs` |
| extension fields | `num_denoising_steps`, `block_length`, `block_schedule`, `confidence_metric`, `target_length`, `attention_backend`, `force_single_batch`, `use_local_leap`, `local_leap_anchor_threshold`, `local_leap_neighbor_threshold`, `local_leap_radius`, `kv_cache`, `confidence_threshold` — top-level fields, see the request schema |

To watch a completion's canvas denoise step by step in the browser, open [/playground](/playground).

Unknown fields are rejected with 400 `unknown_parameter`, never ignored. Every error uses OpenAI's envelope
`{"error": {"message", "type", "param", "code"}}`. Every `/v1` response carries `X-Request-ID`.
""".strip()  # noqa: E501 (markdown table rows)


def add_chat_schemas(openapi: dict) -> dict:
    """Register the request body and the stream chunk, which no route declares as a Python type."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionRequest, ChatCompletionChunk):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi
