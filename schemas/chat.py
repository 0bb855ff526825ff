"""`POST /v1/chat/completions`: the request, the response and the stream chunks.

ADR 005 (docs/adr/005-openai-compatible-api.md) specifies them; docs/design.md ("HTTP contract") adds
the fine print.

The request model is the whole input spec: strict JSON types, unknown fields forbidden, the OpenAI
fields ADR 005 rejects refused with a reason, and the cross-field rules of the extension fields. Rules
that depend on the loaded model (the sequence length) or on the sampler's arithmetic (steps per block)
are the engine's (`engine.SamplingParams`), so the offline API and HTTP reject the same things.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError, from_json

from schemas.errors import ADR, ADR_CITATION, APIError, error_from_validation

if TYPE_CHECKING:  # for type checkers only: importing the engine would load torch
    from engine.params import SamplingParams

# Mirrors of engine.params (schemas never imports the engine: it would pull in torch), for /docs and the
# schema's range checks; tests keep them equal. Omitted fields always take the engine's own defaults.
DEFAULT_GEN_LENGTH = 128
DEFAULT_STEPS = 128
MAX_STEPS = 512
MAX_STOP_STRINGS = 4
MAX_LOCAL_LEAP_RADIUS = 16
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

_SAMPLING_BEYOND_TEMPERATURE = "sampling beyond temperature is out of scope in v0.1; use temperature and seed"
_AR_PENALTY = (
    "it is a per-token autoregressive penalty with no diffusion equivalent (position-aware penalties are deferred)"
)
_FUNCTION_CALLING = "function calling is out of scope in v0.1"
_LOGPROBS = "a diffusion model has no per-token sampling trace; a flat softmax of the final step's logits is deferred"

# field → (neutral value that is accepted, reason). The neutral value must match in JSON type too:
# `n: 1.0` or `n: true` is not the neutral `n: 1`.
ADR_REJECTED_FIELDS: dict[str, tuple[Any, str]] = {
    "top_p": (None, _SAMPLING_BEYOND_TEMPERATURE),
    "top_k": (1, _SAMPLING_BEYOND_TEMPERATURE + " (only the neutral top_k: 1 is accepted)"),
    "presence_penalty": (None, _AR_PENALTY),
    "frequency_penalty": (None, _AR_PENALTY),
    "n": (1, "one completion per request in v0.1 (only n: 1 is accepted); send parallel requests instead"),
    "logit_bias": (None, "logit_bias is deferred (no current demand)"),
    "tools": (None, _FUNCTION_CALLING),
    "tool_choice": (None, _FUNCTION_CALLING),
    "functions": (None, _FUNCTION_CALLING),
    "function_call": (None, _FUNCTION_CALLING),
    "logprobs": (False, _LOGPROBS + " (only logprobs: false is accepted)"),
    "top_logprobs": (None, _LOGPROBS),
}


def _is_neutral(value: Any, neutral: Any) -> bool:
    return neutral is not None and type(value) is type(neutral) and value == neutral


def adr_rejection_message(field: str) -> str:
    return f"{field} is not supported by diffusion sampling ({ADR_CITATION}): {ADR_REJECTED_FIELDS[field][1]}."


def _adr_field(description: str) -> Any:
    return Field(None, description=f"**Rejected ({ADR}).** {description}", json_schema_extra={"deprecated": True})


# --- messages ---------------------------------------------------------------------------------------


class TextContentPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "user", "assistant"] = Field(description="`system`, `user` or `assistant`.")
    content: str | list[TextContentPart] = Field(
        description='A string, or a list of `{"type": "text", "text": ...}` parts (joined with newlines). '
        "Images, audio and other part types are not supported."
    )

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        # One clear message instead of one error per member of the union.
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            for part in value:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    shown = part.get("type") if isinstance(part, dict) else type(part).__name__
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


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = Field(
        None, description="Send one more chunk with `usage` (and empty `choices`). Omitted or null: false."
    )


# --- the request ------------------------------------------------------------------------------------


class ChatCompletionRequest(BaseModel):
    """OpenAI Chat Completions with the deviations and diffusion extension fields of ADR 005
    (docs/adr/005-openai-compatible-api.md).

    Unknown fields are rejected (400 `unknown_parameter`), never ignored. Types are strict: a JSON
    integer is a valid number, but a string is never a number and a float is never an integer.
    """

    model_config = _STRICT

    # OpenAI fields we keep.
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation; at least one message.")
    model: str | None = Field(
        None, description="Accepted and ignored: one server serves one model (see `GET /v1/models`)."
    )
    temperature: float | None = Field(
        None,
        ge=0,
        le=2,
        description="0–2. **Omitted → 0** (deterministic argmax, the reference path; OpenAI's default is 1). "
        "Above 0, each position's token is drawn by Gumbel-max sampling from softmax(logits / temperature).",
    )
    seed: int | None = Field(
        None,
        ge=SEED_MIN,
        le=SEED_MAX,
        description="Seeds the request's own random generator (used when temperature > 0): the same seed and "
        "parameters give the same output. Omitted → a random seed, reported in the response's `diffusion.seed`.",
    )
    stream: bool | None = Field(
        False,
        description="Server-sent events. **Deviation:** one chunk per denoising step carrying the text that "
        "became final in that step (whole words or blocks, not one token per chunk), plus a `diffusion` object.",
    )
    stream_options: StreamOptions | None = Field(None, description="Only with `stream: true`.")
    max_tokens: int | None = Field(
        None,
        ge=1,
        description=f"**Deviation:** the canvas size `gen_length` (default {DEFAULT_GEN_LENGTH}), not a stopping "
        "threshold. Diffusion fills a fixed-length canvas; a shorter answer ends with EOS padding, which is cut.",
    )
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Same as `max_tokens`; if both are given they must be equal."
    )
    stop: str | list[str] | None = Field(
        None,
        description=f"Up to {MAX_STOP_STRINGS} non-empty strings. The text is cut before the occurrence that starts "
        "first (whichever stop string it is, and in whatever order the tokens were committed), "
        '`finish_reason` is "stop", and the request ends as soon as a stop string is final.',
    )
    user: str | None = Field(None, description="An end-user id; logged, not used otherwise.")

    # OpenAI fields ADR 005 rejects: declared so that /docs lists them and the neutral values validate.
    top_p: None = _adr_field("Sampling beyond temperature is out of scope.")
    top_k: int | None = _adr_field("Only the neutral `1` is accepted.")
    presence_penalty: None = _adr_field("Autoregressive per-token penalty.")
    frequency_penalty: None = _adr_field("Autoregressive per-token penalty.")
    n: int | None = _adr_field("Only the neutral `1` is accepted.")
    logit_bias: None = _adr_field("Deferred.")
    tools: None = _adr_field("Function calling is out of scope.")
    tool_choice: None = _adr_field("Function calling is out of scope.")
    functions: None = _adr_field("Function calling is out of scope.")
    function_call: None = _adr_field("Function calling is out of scope.")
    logprobs: bool | None = _adr_field("Only the neutral `false` is accepted.")
    top_logprobs: None = _adr_field("Deferred with `logprobs`.")

    # Diffusion extension fields (ADR 005): top-level, not extra_body.
    num_denoising_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description=f"Forward passes over the canvas, 1–{MAX_STEPS}. Omitted → min({DEFAULT_STEPS}, gen_length). "
        "Must be a multiple of the number of blocks (gen_length / block_length) and give at most block_length "
        "steps per block. Fewer steps commit more tokens per step: faster, usually less accurate. "
        "Not allowed with `confidence_threshold` (the threshold decides the number of forward passes).",
    )
    block_length: int | None = Field(
        None,
        ge=1,
        description="Tokens per block, 1–gen_length; gen_length must be a multiple of it. Omitted → gen_length "
        "(one fully bidirectional block). Blocks are denoised left to right (semi-autoregressive).",
    )
    block_schedule: Literal["uniform", "front_loaded", "cosine", "dream"] | None = Field(
        None,
        description='How many tokens each step of a block commits. "uniform" (LLaDA\'s reference), '
        '"front_loaded" (more early, linearly fewer later), "cosine" (few early, more later), "dream" (Dream\'s '
        "linear-timestep schedule: a share of the tokens still masked, none at first, most at the end). "
        'Omitted → the model\'s own: "uniform" for LLaDA, "dream" for Dream / DiffuCoder.',
    )
    confidence_metric: Literal["top1_prob", "entropy_inverse", "margin"] | None = Field(
        None,
        description='Which masked positions are committed first. "top1_prob": the highest probability of the '
        'predicted token. "entropy_inverse": exp(−entropy) of the position\'s distribution. "margin": the top '
        "token's probability minus the runner-up's. Omitted → the model's own: \"top1_prob\" for LLaDA, "
        '"entropy_inverse" for Dream / DiffuCoder.',
    )
    target_length: int | None = Field(
        None,
        ge=1,
        description="Sets the canvas size (gen_length) directly, ≥ 1; the prompt plus the canvas must fit the "
        f"model's maximum sequence length. Omitted → `max_tokens` (default {DEFAULT_GEN_LENGTH}). If `max_tokens` "
        "is also given, the two must agree.",
    )
    attention_backend: Literal["sdpa", "fa2"] | None = Field(
        None,
        description='"sdpa" (default and only choice: the reference, deterministic path). "fa2" is deferred '
        "until a FlashAttention-2 build for SM 12.0 is in CI, and is rejected.",
    )
    force_single_batch: bool | None = Field(
        None,
        description="true → the request runs alone, never batched with others (for reproducible output). "
        "Default false.",
    )
    use_local_leap: bool | None = Field(
        None,
        description="LocalLeap (arXiv:2510.07081), training-free: besides each step's quota, also commit every "
        "position whose confidence ≥ the anchor threshold and its neighbours (within the radius) whose "
        "confidence ≥ the neighbour threshold. Fewer forward passes. Default false.",
    )
    local_leap_anchor_threshold: float | None = Field(
        None, ge=0, le=1, description="κ, 0–1, default 0.9. Only with `use_local_leap: true`."
    )
    local_leap_neighbor_threshold: float | None = Field(
        None, ge=0, le=1, description="τ, 0–1, default 0.75. Only with `use_local_leap: true`."
    )
    local_leap_radius: int | None = Field(
        None,
        ge=1,
        le=MAX_LOCAL_LEAP_RADIUS,
        description=f"W, 1–{MAX_LOCAL_LEAP_RADIUS} positions, default 4. Only with `use_local_leap: true`.",
    )

    kv_cache: Literal["none", "prefix", "dual"] | None = Field(
        None,
        description='Approximate KV cache (Fast-dLLM, arXiv:2505.22618). "none" (default): every step runs the '
        'whole canvas, the exact reference path. "prefix": after a block\'s first step, the prompt and earlier '
        'blocks are not recomputed (their keys and values from that step are reused). "dual": the block alone is '
        "recomputed; everything else comes from the cache. Faster on long canvases with several blocks "
        '(`block_length` < gen_length); an approximation: output can differ from "none".',
    )
    confidence_threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Threshold decoding (Fast-dLLM): each step commits every masked position of the block whose "
        "confidence ≥ this value, plus always the most confident one, instead of a fixed number per step; a block "
        "takes as many forward passes as it needs. In (0, 1]; omitted → off. 0.9 is Fast-dLLM's setting. Not "
        "with `num_denoising_steps`, `block_schedule` or `use_local_leap`; works with every `kv_cache`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_adr_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for field, (neutral, _) in ADR_REJECTED_FIELDS.items():
                value = data.get(field)
                if value is not None and not _is_neutral(value, neutral):
                    raise PydanticCustomError("unsupported_parameter", adr_rejection_message(field), {"param": field})
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        strings = [value] if isinstance(value, str) else value
        if value is None or (
            isinstance(strings, list)
            and len(strings) <= MAX_STOP_STRINGS  # [] means no stop strings, as in the engine
            and all(isinstance(s, str) and s for s in strings)
        ):
            return value
        raise PydanticCustomError(
            "invalid_value",
            f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings.",
        )

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        def invalid(param: str, message: str) -> PydanticCustomError:
            return PydanticCustomError("invalid_value", message, {"param": param})

        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise invalid(
                "max_completion_tokens",
                f"max_tokens ({self.max_tokens}) and max_completion_tokens ({self.max_completion_tokens}) "
                "disagree; send one of them.",
            )
        requested = self.max_tokens if self.max_tokens is not None else self.max_completion_tokens
        if self.target_length is not None and requested is not None and requested != self.target_length:
            raise invalid(
                "target_length",
                f"target_length ({self.target_length}) sets the canvas size and conflicts with max_tokens "
                f"({requested}); send one of them.",
            )
        if self.attention_backend == "fa2":
            raise invalid(
                "attention_backend",
                f'attention_backend "fa2" is deferred ({ADR_CITATION}) until a FlashAttention-2 build for SM 12.0 '
                'is in CI; use "sdpa" (the default).',
            )
        if not self.use_local_leap:
            for name in ("local_leap_anchor_threshold", "local_leap_neighbor_threshold", "local_leap_radius"):
                if getattr(self, name) is not None:
                    raise invalid(name, f"{name} is only allowed together with use_local_leap: true.")
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true.")
        return self

    # --- what the engine needs -------------------------------------------------------------------------

    @property
    def canvas_field(self) -> str:
        """The request field that sets gen_length: errors about the canvas name it."""
        for name in ("target_length", "max_completion_tokens", "max_tokens"):
            if getattr(self, name) is not None:
                return name
        return "max_tokens"

    def engine_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `engine.SamplingParams`; omitted fields keep the engine's defaults."""
        gen_length = next(
            (v for v in (self.target_length, self.max_tokens, self.max_completion_tokens) if v is not None), None
        )
        kwargs = {
            "gen_length": gen_length,
            "block_length": self.block_length,
            "num_denoising_steps": self.num_denoising_steps,
            "block_schedule": self.block_schedule,
            "confidence_metric": self.confidence_metric,
            "temperature": self.temperature,
            "seed": self.seed,
            "use_local_leap": self.use_local_leap,
            "local_leap_anchor_threshold": self.local_leap_anchor_threshold,
            "local_leap_neighbor_threshold": self.local_leap_neighbor_threshold,
            "local_leap_radius": self.local_leap_radius,
            "force_single_batch": self.force_single_batch,
            "kv_cache": self.kv_cache,
            "confidence_threshold": self.confidence_threshold,
            "stop": (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
        }
        # None means "the engine's default" (engine.SamplingParams resolves it and reports it back).
        return {k: v for k, v in kwargs.items() if v is not None}

    def http_param(self, engine_field: str) -> str:
        """The request field behind an engine parameter, for `error.param`."""
        return self.canvas_field if engine_field == "gen_length" else engine_field


def _field_names(*models: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for model in models for name in model.model_fields)


REQUEST_FIELDS = _field_names(ChatCompletionRequest, ChatMessage, TextContentPart, StreamOptions)


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """The request body → a validated request, or the one `APIError` that explains what to fix."""
    try:
        data = from_json(body) if body else None
    except ValueError as exc:
        raise APIError.invalid_json(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise APIError.invalid_json("The request body must be a JSON object.")
    try:
        # Validate the bytes, not `data`: strict JSON mode is what defines the type rules above.
        return ChatCompletionRequest.model_validate_json(body)
    except ValidationError as exc:
        raise error_from_validation(exc, REQUEST_FIELDS) from None


# --- responses -------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(description="Tokens of the returned content (before EOS or the stop cut).")
    total_tokens: int


class ResolvedDiffusion(BaseModel):
    """The parameters a request actually ran with (defaults resolved) and what it cost."""

    gen_length: int = Field(description="Canvas size in tokens.")
    block_length: int
    num_blocks: int
    num_denoising_steps: int | None = Field(description="null with `confidence_threshold` (no step count).")
    block_schedule: str
    confidence_metric: str
    temperature: float
    seed: int = Field(description="The seed used: send it back to reproduce the output at temperature > 0.")
    attention_backend: str = "sdpa"
    force_single_batch: bool
    use_local_leap: bool
    local_leap_anchor_threshold: float | None
    local_leap_neighbor_threshold: float | None
    local_leap_radius: int | None
    kv_cache: str
    confidence_threshold: float | None
    stop: list[str]
    num_forward_passes: int = Field(description="Model forward passes spent (early exit and LocalLeap lower it).")

    @classmethod
    def of(cls, params: SamplingParams, num_forward_passes: int) -> ResolvedDiffusion:
        """From the engine's resolved `SamplingParams`."""
        fields = {name: getattr(params, name) for name in cls.model_fields if hasattr(params, name) and name != "stop"}
        return cls(**fields, stop=list(params.stop), num_forward_passes=num_forward_passes)


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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
