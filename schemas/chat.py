"""`POST /v1/chat/completions`: the request, the response and the stream chunks.

ADR 005 (docs/adr/005-openai-compatible-api.md) specifies them; docs/design.md ("HTTP contract") adds
the fine print. The fields both generation endpoints share, and their rules, are in schemas/sampling.py;
what happens to each OpenAI field is the table in schemas/fields.py.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StringConstraints, create_model, field_validator, model_serializer
from pydantic_core import PydanticCustomError

from engine.params import SamplingParams
from engine.prompt import Prompt
from schemas.fields import openai_field
from schemas.knobs import resolved_fields
from schemas.sampling import (
    STRICT,
    GenerationRequest,
    StreamOptions,
    classified,
    field_names,
    parse_request,
    refuse_unless,
)

# --- messages ---------------------------------------------------------------------------------------

NON_TEXT_PARTS = openai_field("chat", "messages[].content[]: image_url, input_audio, file, refusal")
TOOL_ROLES = ("tool", "function")


class PromptCacheBreakpoint(BaseModel):
    model_config = STRICT
    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class TextContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = Field(
        None, description=openai_field("chat", "messages[].content[].prompt_cache_breakpoint").doc()
    )


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool", "function"] = Field(
        description="`system`, `developer` (OpenAI's newer name for system instructions: the same here), `user` "
        "or `assistant`. `tool` and `function` are refused: function calling is out of scope.",
        json_schema_extra={"enum": ["system", "developer", "user", "assistant"]},  # what is accepted
    )
    content: str | list[TextContentPart] = Field(
        description='A string, or a list of `{"type": "text", "text": ...}` parts (joined with newlines). '
        "Images, audio and other part types are not supported."
    )
    # OpenAI message fields with no meaning here (schemas/fields.py): refused unless null.
    name: Any = classified("chat", "messages[].name")
    tool_calls: Any = classified("chat", "messages[].tool_calls")
    function_call: Any = classified("chat", "messages[].function_call")
    tool_call_id: Any = classified("chat", "messages[].tool_call_id")
    refusal: Any = classified("chat", "messages[].refusal")
    audio: Any = classified("chat", "messages[].audio")

    @field_validator("name", "tool_calls", "function_call", "tool_call_id", "refusal", "audio", mode="before")
    @classmethod
    def _refused_message_fields(cls, value: Any, info: Any) -> Any:
        row = openai_field("chat", f"messages[].{info.field_name}")
        refuse_unless(row.accepts(value), row.rejection_message())
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _no_tool_roles(cls, value: Any) -> Any:
        row = openai_field("chat", "messages[].role: tool, function")
        refuse_unless(value not in TOOL_ROLES, row.rejection_message(f"role {value!r}"))
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        # One clear message instead of one error per member of the union.
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                refuse_unless(
                    kind not in NON_TEXT_PARTS.name.partition(": ")[2].split(", "),
                    NON_TEXT_PARTS.rejection_message(f"content part type {kind!r}"),
                )
                if not (kind == "text" and isinstance(part.get("text"), str)):
                    shown = kind if isinstance(part, dict) else type(part).__name__
                    raise PydanticCustomError(
                        "invalid_value",
                        'Invalid content part ({shown}): only {"type": "text", "text": "..."} parts are supported.',
                        {"shown": repr(shown)},
                    )
            return value
        raise PydanticCustomError(
            "invalid_value", 'content must be a string or a list of {"type": "text", "text": "..."} parts.'
        )

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def engine_role(self) -> str:
        # OpenAI introduced "developer" as the new name of "system" instructions; the chat templates know "system".
        return "system" if self.role == "developer" else self.role


class PromptCacheOptions(BaseModel):
    model_config = STRICT
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


# --- the request ------------------------------------------------------------------------------------

MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ChatCompletionRequest(GenerationRequest):
    """OpenAI Chat Completions with the deviations and diffusion extension fields of ADR 005
    (docs/adr/005-openai-compatible-api.md).

    Unknown fields are rejected (400 `unknown_parameter`), never ignored. Types are strict: a JSON
    integer is a valid number, but a string is never a number and a float is never an integer.
    """

    ENDPOINT: ClassVar = "chat"
    CANVAS_FIELDS: ClassVar = ("target_length", "max_completion_tokens", "max_tokens")

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation; at least one message.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Same as `max_tokens`; if both are given they must be equal."
    )
    safety_identifier: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        None, description="An end-user id (at most 128 characters); logged, not used otherwise."
    )
    prompt_cache_key: str | None = Field(None, description="Logged, not used otherwise (no prompt cache).")
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        None,
        max_length=16,
        description="Up to 16 string pairs (keys ≤ 64, values ≤ 512 characters); logged, not used otherwise.",
    )

    # Chat's own OpenAI fields that are refused beyond their neutral values (schemas/fields.py; ADR 005).
    logprobs: Any = classified("chat", "logprobs")
    top_logprobs: Any = classified("chat", "top_logprobs")
    reasoning_effort: Any = classified("chat", "reasoning_effort")
    response_format: Any = classified("chat", "response_format")
    modalities: Any = classified("chat", "modalities")
    store: Any = classified("chat", "store")
    service_tier: Any = classified("chat", "service_tier")
    verbosity: Any = classified("chat", "verbosity")
    tools: Any = classified("chat", "tools")
    tool_choice: Any = classified("chat", "tool_choice")
    parallel_tool_calls: Any = classified("chat", "parallel_tool_calls")
    functions: Any = classified("chat", "functions")
    function_call: Any = classified("chat", "function_call")
    audio: Any = classified("chat", "audio")
    prediction: Any = classified("chat", "prediction")
    web_search_options: Any = classified("chat", "web_search_options")
    moderation: Any = classified("chat", "moderation")
    # Caching hints: every valid value is a no-op (the server keeps no prompt cache between requests).
    prompt_cache_options: PromptCacheOptions | None = Field(
        None, description=openai_field("chat", "prompt_cache_options").doc()
    )
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(
        None, description=openai_field("chat", "prompt_cache_retention").doc(), json_schema_extra={"deprecated": True}
    )

    def engine_messages(self) -> list[dict[str, str]]:
        return [{"role": m.engine_role(), "content": m.text()} for m in self.messages]

    def engine_prompt(self) -> Prompt:
        return Prompt.chat(self.engine_messages())

    def logged_fields(self) -> dict[str, Any]:
        logged = {"user": self.user, "safety_identifier": self.safety_identifier}
        logged |= {"prompt_cache_key": self.prompt_cache_key, "metadata": self.metadata}
        return {name: value for name, value in logged.items() if value}


REQUEST_FIELDS = field_names(ChatCompletionRequest, ChatMessage, TextContentPart, StreamOptions, PromptCacheOptions)


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """The request body → a validated request, or the one `APIError` that explains what to fix."""
    return parse_request(ChatCompletionRequest, body, REQUEST_FIELDS)


# --- responses -------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(description="Tokens of the returned content (before EOS or the stop cut).")
    total_tokens: int


class _Resolved(BaseModel):
    @classmethod
    def of(cls, params: SamplingParams, num_forward_passes: int) -> ResolvedDiffusion:
        """From the engine's resolved `SamplingParams`."""
        fields = {name: getattr(params, name) for name in cls.model_fields if hasattr(params, name) and name != "stop"}
        return cls(**fields, stop=list(params.stop), num_forward_passes=num_forward_passes)


# One field per sampler knob (engine.params), as the request ran with it: defaults resolved.
ResolvedDiffusion = create_model(
    "ResolvedDiffusion",
    __base__=_Resolved,
    __doc__="The parameters a request actually ran with (defaults resolved) and what it cost.",
    **resolved_fields(),
    num_forward_passes=(int, Field(description="Model forward passes spent (early exit and LocalLeap lower it).")),
)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] = Field(
        description='"stop": the model ended its answer (EOS) or a stop string was found; "length": the canvas '
        "filled up without an end."
    )
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str = Field(description="`chatcmpl-<X-Request-ID>`.")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="The served model, whatever the request's `model` said.")
    choices: list[Choice]
    usage: Usage
    diffusion: ResolvedDiffusion


class CommittedToken(BaseModel):
    position: int = Field(description="Offset from the first generated position (0).")
    token_id: int
    text: str = Field(description="The token's own text (special tokens by name).")


class StepDiffusion(BaseModel):
    step: int = Field(description="0-based forward pass index, contiguous.")
    block: int
    committed: list[CommittedToken] = Field(description="Tokens committed by this step, anywhere in the block.")
    edited: list[CommittedToken] = Field(
        description="Tokens this step overwrote (already written positions given another token): LLaDA2.1's token "
        "editing (`editing_threshold`) only, always empty otherwise. An edited position's text is streamed once "
        "its block closes, so `delta.content` never has to be taken back."
    )
    masked_remaining: int = Field(description="Canvas positions still masked; never increases.")


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict:
        # OpenAI deltas carry only what changed: {"role": ...} first, then {"content": ...}, {} at the end.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    diffusion: StepDiffusion | ResolvedDiffusion | None = Field(
        None, description="Step chunks: the step's commits. The finish chunk: the resolved parameters."
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dllm-serve"
    max_sequence_length: int | None = None
    # Weight-only quantization of the loaded weights (DLLM_QUANTIZE): none, int8, int4 or fp8.
    quantization: str = "none"
    family: Literal["llada", "dream", "llada2"] | None = Field(
        None,
        description='The model family, which decides the sampler defaults and the knobs that apply: "llada" '
        '(LLaDA, LLaDA-1.5), "dream" (Dream, DiffuCoder), "llada2" (LLaDA2.0 / 2.1, block diffusion).',
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
