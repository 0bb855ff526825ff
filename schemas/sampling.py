"""What both generation endpoints share: the sampling fields, the diffusion extension fields and their rules.

`GenerationRequest` is the base of `ChatCompletionRequest` (schemas/chat.py) and `CompletionRequest`
(schemas/completions.py); they add only how the prompt is given and their endpoint's own OpenAI fields.
Every OpenAI field's status comes from the table in schemas/fields.py; ADR 005
(docs/adr/005-openai-compatible-api.md) is the decision behind it.

The models type the JSON (strict types, unknown fields forbidden) and refuse the values of OpenAI fields
this server does not honour, with a reason; the sampler knobs' fields are derived from their one definition
(`engine.params`, through schemas/knobs.py). The knobs' ranges and the rules between them are checked once,
by `engine.SamplingParams` (`sampling_params`), so the offline API and HTTP reject the same things with the
same words; what depends on the loaded model (the sequence length) is checked by the engine.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError, from_json

from engine.params import DEFAULT_GEN_LENGTH, KNOB, SamplingParams
from engine.prompt import Prompt
from schemas.errors import ADR_CITATION, APIError, error_from_validation
from schemas.fields import ANY, Endpoint, openai_field, top_level_names
from schemas.knobs import REQUEST_KNOBS, range_schema, request_fields, request_only

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


def canvas_field(description: str) -> Any:
    """A field that sets the canvas size (gen_length): its range is that knob's, checked by `SamplingParams`."""
    return Field(None, description=description, json_schema_extra=range_schema(KNOB["gen_length"]))


class _GenerationFields(BaseModel):
    """The fields both endpoints share, but for the sampler knobs (added by `GenerationRequest`)."""

    model_config = STRICT
    ENDPOINT: ClassVar[Endpoint]
    CANVAS_FIELDS: ClassVar[tuple[str, ...]] = ("target_length", "max_tokens")

    # OpenAI fields kept (or changed: ADR 005). temperature, seed and stop are sampler knobs.
    model: str | None = Field(
        None, description="Accepted and ignored: one server serves one model (see `GET /v1/models`)."
    )
    stream: bool | None = Field(
        False,
        description="Server-sent events. **Deviation:** one chunk per denoising step carrying the text that "
        "became final in that step (whole words or blocks, not one token per chunk), plus a `diffusion` object.",
    )
    stream_options: StreamOptions | None = Field(None, description="Only with `stream: true`.")
    max_tokens: int | None = canvas_field(
        f"**Deviation:** the canvas size `gen_length` (default {DEFAULT_GEN_LENGTH}), not a stopping threshold. "
        "Diffusion fills a fixed-length canvas; a shorter answer ends with EOS padding, which is cut."
    )
    user: str | None = Field(None, description="An end-user id; logged, not used otherwise.")

    # OpenAI fields refused beyond their neutral values (schemas/fields.py; ADR 005).
    top_p: Any = classified("chat", "top_p")
    top_k: Any = classified("chat", "top_k")
    presence_penalty: Any = classified("chat", "presence_penalty")
    frequency_penalty: Any = classified("chat", "frequency_penalty")
    n: Any = classified("chat", "n")
    logit_bias: Any = classified("chat", "logit_bias")

    # The extension fields (ADR 005) that are not sampler knobs: top-level, not extra_body.
    target_length: int | None = canvas_field(request_only("target_length").description())
    attention_backend: Literal["sdpa", "fa2"] | None = Field(
        None,
        description=request_only("attention_backend").description(),
        json_schema_extra=lambda schema: schema.update(anyOf=[{"const": "sdpa"}, {"type": "null"}]),  # accepted
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

    @model_validator(mode="after")
    def _consistent(self) -> _GenerationFields:
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

    def engine_prompt(self) -> Prompt:
        """The prompt as the engine takes it (each endpoint says how its body gives one)."""
        raise NotImplementedError

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `engine.SamplingParams`; omitted fields keep the engine's defaults."""
        kwargs = {spec.name: getattr(self, spec.name) for spec in REQUEST_KNOBS}
        kwargs["gen_length"] = getattr(self, self.canvas_field)
        # None means "the engine's default" (engine.SamplingParams resolves it and reports it back).
        return {k: v for k, v in kwargs.items() if v is not None}

    def sampling_params(self, defaults: Any = None) -> SamplingParams:
        """The engine's parameters for this request: where every knob's range and rule is checked (once). Raises
        `engine.InvalidParameter` naming the engine's field (`http_param` gives the request's). `defaults`: the
        loaded family's `SamplerDefaults` (what the request leaves out takes the family's settings)."""
        return SamplingParams.for_model(defaults, **self.sampling_kwargs())

    def http_param(self, engine_field: str) -> str:
        """The request field behind an engine parameter, for `error.param`."""
        return self.canvas_field if engine_field == "gen_length" else engine_field


GenerationRequest = create_model(
    "GenerationRequest",
    __base__=_GenerationFields,
    __doc__="""The fields both endpoints share, the sampler knobs included (from engine.params). Subclasses set
    `ENDPOINT` (their rows in schemas/fields.py) and `CANVAS_FIELDS` (the fields that set the canvas size, in
    the order they win).""",
    **request_fields(),
)


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
