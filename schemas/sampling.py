"""What both generation endpoints share: the sampling fields, the diffusion extension fields and their rules.

`GenerationRequest` is the base of `ChatCompletionRequest` (schemas/chat.py) and `CompletionRequest`
(schemas/completions.py); they add only how the prompt is given and their endpoint's own OpenAI fields.
Every OpenAI field's status comes from the table in schemas/fields.py; ADR 005
(docs/adr/005-openai-compatible-api.md) is the decision behind it.

The models are the whole input spec: strict JSON types, unknown fields forbidden, refused values of
OpenAI fields reported with a reason, and the cross-field rules of the extension fields. Rules that
depend on the loaded model (the sequence length) or on the sampler's arithmetic (steps per block) are
the engine's (`engine.SamplingParams`), so the offline API and HTTP reject the same things.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError, from_json

from schemas.errors import ADR_CITATION, APIError, error_from_validation
from schemas.fields import ANY, Endpoint, openai_field, top_level_names

# Mirrors of engine.params (schemas never imports the engine: it would pull in torch), for /docs and the
# schema's range checks; tests keep them equal. Omitted fields always take the engine's own defaults.
DEFAULT_GEN_LENGTH = 128
DEFAULT_STEPS = 128
MAX_STEPS = 512
MAX_STOP_STRINGS = 4
MAX_LOCAL_LEAP_RADIUS = 16
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def classified(endpoint: Endpoint, name: str) -> Any:
    """The declaration of an OpenAI field that refuses values: its /docs text and the values it accepts
    come from its row in schemas/fields.py (the request model's validator enforces them)."""
    row = openai_field(endpoint, name)
    accepted = [{"const": value} for value in row.neutral if value is not ANY]
    schema: dict[str, Any] = {"anyOf": [*accepted, {"type": "null"}]} if accepted else {"type": "null"}
    if row.status == "rejected" or row.alias_of:
        schema["deprecated"] = True
    return Field(None, description=row.doc(), json_schema_extra=schema)


def refuse_unless(accepted: bool, message: str, param: str | None = None) -> None:
    """A 400 `unsupported_parameter` (param: the field; nested fields take theirs from the error's location)."""
    if not accepted:
        raise PydanticCustomError("unsupported_parameter", message, {"param": param} if param else None)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = Field(
        None, description="Send one more chunk with `usage` (and empty `choices`). Omitted or null: false."
    )
    include_obfuscation: Any = classified("chat", "stream_options.include_obfuscation")

    @field_validator("include_obfuscation", mode="before")
    @classmethod
    def _no_obfuscation(cls, value: Any) -> Any:
        row = openai_field("chat", "stream_options.include_obfuscation")
        refuse_unless(row.accepts(value), row.rejection_message())
        return value


class GenerationRequest(BaseModel):
    """The fields both endpoints share. Subclasses set `ENDPOINT` (their rows in schemas/fields.py) and
    `CANVAS_FIELDS` (the fields that set the canvas size, in the order they win)."""

    model_config = STRICT
    ENDPOINT: ClassVar[Endpoint]
    CANVAS_FIELDS: ClassVar[tuple[str, ...]] = ("target_length", "max_tokens")

    # OpenAI fields kept (or changed: ADR 005).
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
    stop: str | list[str] | None = Field(
        None,
        description=f"Up to {MAX_STOP_STRINGS} non-empty strings. The text is cut before the occurrence that starts "
        "first (whichever stop string it is, and in whatever order the tokens were committed), "
        '`finish_reason` is "stop", and the request ends as soon as a stop string is final.',
    )
    user: str | None = Field(None, description="An end-user id; logged, not used otherwise.")

    # OpenAI fields refused beyond their neutral values (schemas/fields.py; ADR 005).
    top_p: Any = classified("chat", "top_p")
    top_k: Any = classified("chat", "top_k")
    presence_penalty: Any = classified("chat", "presence_penalty")
    frequency_penalty: Any = classified("chat", "frequency_penalty")
    n: Any = classified("chat", "n")
    logit_bias: Any = classified("chat", "logit_bias")

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
        json_schema_extra=lambda schema: schema.update(anyOf=[{"const": "sdpa"}, {"type": "null"}]),  # accepted
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
    def _refuse_unsupported_values(cls, data: Any) -> Any:
        # Before type validation, so that `top_p: 0.9` says why top_p is refused rather than "not null".
        if isinstance(data, dict):
            for name in sorted(top_level_names(cls.ENDPOINT) & data.keys()):
                row = openai_field(cls.ENDPOINT, name)
                if row.refuses_values:
                    refuse_unless(row.accepts(data[name]), row.rejection_message(), param=name)
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
    def _consistent(self) -> GenerationRequest:
        def invalid(param: str, message: str) -> PydanticCustomError:
            return PydanticCustomError("invalid_value", message, {"param": param})

        # The fields that set the canvas must agree: the OpenAI names with each other, then with target_length.
        requested = [(name, getattr(self, name)) for name in self.CANVAS_FIELDS if name != "target_length"]
        requested = [(name, value) for name, value in requested if value is not None]
        if len({value for _, value in requested}) > 1:
            (name, value), (other, other_value) = sorted(requested)[:2]  # max_completion_tokens, max_tokens
            raise invalid(name, f"{other} ({other_value}) and {name} ({value}) disagree; send one of them.")
        if self.target_length is not None and requested and requested[0][1] != self.target_length:
            raise invalid(
                "target_length",
                f"target_length ({self.target_length}) sets the canvas size and conflicts with {requested[0][0]} "
                f"({requested[0][1]}); send one of them.",
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

    # --- what the engine and the log need ----------------------------------------------------------------

    @property
    def canvas_field(self) -> str:
        """The request field that sets gen_length: errors about the canvas name it."""
        return next((name for name in self.CANVAS_FIELDS if getattr(self, name) is not None), "max_tokens")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def logged_fields(self) -> dict[str, Any]:
        """The end-user ids and tags a client attached: logged with the request line, otherwise unused."""
        return {"user": self.user} if self.user else {}

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `engine.SamplingParams`; omitted fields keep the engine's defaults."""
        kwargs = {
            "gen_length": getattr(self, self.canvas_field),
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


def field_names(*models: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for model in models for name in model.model_fields)


def parse_request(model: type[GenerationRequest], body: bytes, known_fields: frozenset[str]) -> Any:
    """The request body → a validated request, or the one `APIError` that explains what to fix."""
    try:
        data = from_json(body) if body else None
    except ValueError as exc:
        raise APIError.invalid_json(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise APIError.invalid_json("The request body must be a JSON object.")
    try:
        # Validate the bytes, not `data`: strict JSON mode is what defines the type rules above.
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise error_from_validation(exc, known_fields) from None
