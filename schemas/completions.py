"""`POST /v1/completions` (OpenAI's legacy text completions): the request, the response and the stream chunks.

The prompt is raw text (or token ids), given to the model as is: no chat template. Everything after the
prompt is the chat endpoint's: the same sampling and diffusion extension fields (schemas/sampling.py),
the same refusals (schemas/fields.py), the same engine path; the response carries `choices[].text`
instead of a message.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Len
from pydantic import BaseModel, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from engine.prompt import Prompt
from schemas.chat import ResolvedDiffusion, StepDiffusion, Usage
from schemas.fields import openai_field
from schemas.sampling import GenerationRequest, StreamOptions, classified, field_names, parse_request, refuse_unless

_ONE_PROMPT = openai_field("completions", "n").reason.replace("n: 1", "one prompt")


Text = Annotated[str, StringConstraints(min_length=1)]
# The model's vocabulary bounds the ids from above: the engine checks that (400 on `prompt`).
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Len(1)]


class CompletionRequest(GenerationRequest):
    """OpenAI Completions with the deviations and diffusion extension fields of ADR 005
    (docs/adr/005-openai-compatible-api.md), validated as strictly as chat requests."""

    ENDPOINT: ClassVar = "completions"

    prompt: Text | Annotated[list[Text], Len(1, 1)] | TokenIds | Annotated[list[TokenIds], Len(1, 1)] = Field(
        description="Raw text given to the model as is (no chat template): a string or a list of one string. "
        "Or token ids: a list of integers, or a list of one such list. Special-token text in a string stays "
        "plain text. One prompt per request."
    )
    # Completions' own OpenAI fields that are refused beyond their neutral values (schemas/fields.py).
    best_of: Any = classified("completions", "best_of")
    echo: Any = classified("completions", "echo")
    logprobs: Any = classified("completions", "logprobs")
    suffix: Any = classified("completions", "suffix")

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        # One clear message instead of one error per member of the union.
        if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
            refuse_unless(False, f"Several prompts in one request are not supported: {_ONE_PROMPT}.")
        one = value[0] if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)) else value
        is_text = isinstance(one, str) and one != ""
        is_ids = isinstance(one, list) and one and all(type(i) is int and i >= 0 for i in one)  # no bools
        if not (is_text or is_ids):
            raise PydanticCustomError(
                "invalid_value",
                "prompt must be a non-empty string, a non-empty list of token ids (integers ≥ 0), or a list of "
                "one of either.",
            )
        return value

    def engine_prompt(self) -> Prompt:
        """Raw text or token ids, as the engine takes them."""
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):  # a list of one prompt
            prompt = prompt[0]
        return Prompt.text(prompt) if isinstance(prompt, str) else Prompt.token_ids(prompt)

    def http_param(self, engine_field: str) -> str:
        if engine_field in ("prompt", "prompt_token_ids", "messages"):  # the engine's names of a prompt
            return "prompt"
        return super().http_param(engine_field)


REQUEST_FIELDS = field_names(CompletionRequest, StreamOptions)


def parse_completion_request(body: bytes) -> CompletionRequest:
    """The request body → a validated request, or the one `APIError` that explains what to fix."""
    return parse_request(CompletionRequest, body, REQUEST_FIELDS)


# --- responses -------------------------------------------------------------------------------------


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = Field(
        description='"stop": the model ended its text (EOS) or a stop string was found; "length": the canvas '
        "filled up without an end. null on stream chunks before the last."
    )
    logprobs: None = None


class TextCompletion(BaseModel):
    id: str = Field(description="`cmpl-<X-Request-ID>`.")
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str = Field(description="The served model, whatever the request's `model` said.")
    choices: list[TextChoice]
    usage: Usage | None = None
    diffusion: ResolvedDiffusion | StepDiffusion | None = Field(
        None,
        description="The resolved parameters (the response, the stream's finish chunk) or the step's commits "
        "(stream step chunks).",
    )
