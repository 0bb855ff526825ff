"""Every request field of OpenAI's Chat Completions and (legacy) Completions APIs, classified, in one table.

This table is the single source of what the server does with a field OpenAI defines: the request models
(schemas/chat.py, schemas/completions.py) declare one attribute per row and refuse the values the row
refuses; /docs shows the row's text; the README and docs/api.md tables are tested against it
(tests/test_openai_fields.py), as is the field list of the installed `openai` SDK, so that a field OpenAI
adds shows up as a failing test rather than as `unknown_parameter` for a field OpenAI documents.

Statuses:
- kept: as OpenAI defines it.
- deviates: accepted, with a meaning that differs (the README and /docs say how).
- neutral: accepted only at values that ask for nothing this server does not do (a no-op, as `n: 1`);
  any other value is a 400 `unsupported_parameter` that names the field and says why.
- rejected: any value but null is a 400 `unsupported_parameter` that names the field and says why.
- deprecated alias: OpenAI's older name of another field; treated as that field is.
- extension: a diffusion setting OpenAI does not have (ADR 005, "Added"). Those have no row here: they are
  the sampler knobs, derived from their definitions in engine.params (schemas/knobs.py).
Only a field that is in no row, and no extension field, is `unknown_parameter`.

Neutral values are compared as JSON values of the same type: `n: 1.0` or `n: true` is not the neutral
`n: 1`. `ANY` marks a field whose every valid value is a no-op (caching hints for a server that keeps no
prompt cache between requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine.params import DEFAULT_GEN_LENGTH, MAX_STOP_STRINGS
from schemas.errors import ADR_CITATION

Endpoint = Literal["chat", "completions"]
Status = Literal["kept", "deviates", "neutral", "rejected", "deprecated alias", "extension"]
CHAT: frozenset[Endpoint] = frozenset({"chat"})
COMPLETIONS: frozenset[Endpoint] = frozenset({"completions"})
BOTH: frozenset[Endpoint] = CHAT | COMPLETIONS
ANY = object()  # every valid value of the field is neutral


@dataclass(frozen=True)
class OpenAIField:
    """One row: a request field, where it exists, and what this server does with it."""

    name: str  # top level, or a path such as "messages[].name"
    endpoints: frozenset[Endpoint]
    status: Status
    summary: str  # what it means here, one line (README, docs/api.md, /docs)
    neutral: tuple[Any, ...] = ()  # JSON values accepted as no-ops besides null (neutral / rejected rows)
    reason: str = ""  # why other values are refused (the 400's message)
    alias_of: str | None = None

    @property
    def refuses_values(self) -> bool:
        """Whether some non-null value of the field is a 400 `unsupported_parameter`."""
        return self.status in ("neutral", "rejected", "deprecated alias") and ANY not in self.neutral

    def accepts(self, value: Any) -> bool:
        return value is None or ANY in self.neutral or any(same_json(value, n) for n in self.neutral)

    def rejection_message(self, subject: str | None = None) -> str:
        """The 400's message: what is refused (the field, or e.g. a content part's type), the ADR, and why."""
        return f"{subject or self.name} is not supported ({ADR_CITATION}): {self.reason}."

    def doc(self) -> str:
        """The /docs description of a field that refuses values: its status, the accepted values, why."""
        label = {"neutral": "Neutral values only", "rejected": "Rejected"}.get(self.status, self.status.capitalize())
        accepted = ", ".join(f"`{shown_json(n)}`" for n in self.neutral if n is not ANY)
        text = f"**{label} (ADR 005):** {self.summary}."
        if accepted:
            text += f" Accepted: {accepted} (or null)."
        return text + f" Why: {self.reason}."


def same_json(value: Any, neutral: Any) -> bool:
    """Equal as JSON values of the same JSON type (1 is not 1.0 nor true)."""
    if type(value) is not type(neutral):
        return False
    if isinstance(neutral, dict):
        return value.keys() == neutral.keys() and all(same_json(value[k], neutral[k]) for k in neutral)
    if isinstance(neutral, list):
        return len(value) == len(neutral) and all(same_json(v, n) for v, n in zip(value, neutral))
    return value == neutral


def shown_json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(", ", ": "))


_SAMPLING = "sampling beyond temperature is out of scope in v0.1; use temperature and seed"
_PENALTY = (
    "it is a per-token autoregressive penalty with no diffusion equivalent (position-aware penalties are deferred)"
)
_FUNCTIONS = "function calling is out of scope in v0.1"
_LOGPROBS = "a diffusion model has no per-token sampling trace; a flat softmax of the final step's logits is deferred"
_TEXT_ONLY = "the served models read and write text only"
_NO_CACHE = "the server keeps no prompt cache between requests (a request's KV cache lives and dies with it)"

OPENAI_FIELDS: tuple[OpenAIField, ...] = (
    # --- the prompt ----------------------------------------------------------------------------------
    OpenAIField(
        "messages",
        CHAT,
        "kept",
        "the conversation; roles `system`, `developer` (= system), `user`, `assistant`; text content",
    ),
    OpenAIField(
        "prompt",
        COMPLETIONS,
        "kept",
        "raw text, no chat template: a string or a list of one; or token ids (integers, or a list of one such list)",
    ),
    OpenAIField("model", BOTH, "kept", "accepted and ignored: one server serves one model (`GET /v1/models`)"),
    # --- kept and changed sampling fields ----------------------------------------------------------------
    OpenAIField("temperature", BOTH, "deviates", "0–2 as usual, but **omitted means 0** (deterministic argmax), not 1"),
    OpenAIField("seed", BOTH, "kept", "reproducible sampling; the seed used is returned in `diffusion.seed`"),
    OpenAIField(
        "stop",
        BOTH,
        "kept",
        f'up to {MAX_STOP_STRINGS} strings; text cut before the first, `finish_reason: "stop"`, the request ends early',
    ),
    OpenAIField(
        "stream",
        BOTH,
        "deviates",
        "one chunk per denoising step carrying the text that became final in it (bursts and empty chunks, never one "
        "token per chunk), each with a `diffusion` object",
    ),
    OpenAIField("stream_options", BOTH, "kept", "`include_usage`; only with `stream: true`"),
    OpenAIField(
        "stream_options.include_obfuscation",
        BOTH,
        "neutral",
        "stream chunks carry no obfuscation padding",
        neutral=(False,),
        reason="stream obfuscation is not implemented (chunks carry no `obfuscation` field)",
    ),
    OpenAIField(
        "max_completion_tokens",
        CHAT,
        "deviates",
        f"the canvas size `gen_length` (default {DEFAULT_GEN_LENGTH}), not a stopping threshold: a shorter answer "
        "ends with EOS padding "
        '(cut off), a longer one is truncated (`finish_reason: "length"`); a large value costs compute',
    ),
    OpenAIField(
        "max_tokens",
        BOTH,
        "deviates",
        "OpenAI's older name of `max_completion_tokens` in chat: the same canvas size",
    ),
    OpenAIField("user", BOTH, "kept", "logged with the request, otherwise unused"),
    OpenAIField(
        "safety_identifier", CHAT, "kept", "logged with the request (at most 128 characters), otherwise unused"
    ),
    OpenAIField("prompt_cache_key", CHAT, "kept", "logged with the request, otherwise unused"),
    OpenAIField(
        "metadata",
        CHAT,
        "kept",
        "logged with the request (at most 16 string pairs, keys ≤ 64 and values ≤ 512 characters), otherwise unused",
    ),
    # --- neutral values only ----------------------------------------------------------------------------
    OpenAIField(
        "n",
        BOTH,
        "neutral",
        "one completion per request",
        neutral=(1,),
        reason="one completion per request in v0.1 (only n: 1 is accepted); send parallel requests instead",
    ),
    OpenAIField(
        "top_k",
        BOTH,
        "neutral",
        "not an OpenAI field, but common (vLLM); `1` is argmax, a no-op",
        neutral=(1,),
        reason=_SAMPLING + " (only the neutral top_k: 1 is accepted)",
    ),
    OpenAIField(
        "logprobs",
        CHAT,
        "neutral",
        "no log-probabilities",
        neutral=(False,),
        reason=_LOGPROBS + " (only logprobs: false is accepted)",
    ),
    OpenAIField(
        "reasoning_effort",
        CHAT,
        "neutral",
        "the models have no reasoning mode",
        neutral=("none",),
        reason='the served models have no reasoning mode (only reasoning_effort: "none" is accepted)',
    ),
    OpenAIField(
        "response_format",
        CHAT,
        "neutral",
        "plain text only",
        neutral=({"type": "text"},),
        reason='constrained decoding (JSON mode, JSON schema) is not implemented; only {"type": "text"} is accepted',
    ),
    OpenAIField(
        "modalities",
        CHAT,
        "neutral",
        "text output only",
        neutral=(["text"],),
        reason=_TEXT_ONLY + ' (only modalities: ["text"] is accepted)',
    ),
    OpenAIField(
        "store",
        CHAT,
        "neutral",
        "nothing is stored",
        neutral=(False,),
        reason="the server stores no completions (only store: false is accepted)",
    ),
    OpenAIField(
        "service_tier",
        CHAT,
        "neutral",
        "one service tier",
        neutral=("auto", "default"),
        reason='the server has one service tier (only "auto" and "default" are accepted)',
    ),
    OpenAIField(
        "verbosity",
        CHAT,
        "neutral",
        "no verbosity control; OpenAI's default is accepted",
        neutral=("medium",),
        reason='the served models have no verbosity control (only OpenAI\'s default, "medium", is accepted)',
    ),
    OpenAIField(
        "prompt_cache_options", CHAT, "neutral", "any valid value is a no-op", neutral=(ANY,), reason=_NO_CACHE
    ),
    OpenAIField(
        "prompt_cache_retention",
        CHAT,
        "deprecated alias",
        "of `prompt_cache_options.ttl`: a no-op",
        neutral=(ANY,),
        reason=_NO_CACHE,
        alias_of="prompt_cache_options",
    ),
    OpenAIField(
        "best_of",
        COMPLETIONS,
        "neutral",
        "one candidate per request",
        neutral=(1,),
        reason="one completion per request in v0.1 (only best_of: 1 is accepted)",
    ),
    OpenAIField(
        "echo",
        COMPLETIONS,
        "neutral",
        "the prompt is not repeated in the text",
        neutral=(False,),
        reason="echoing the prompt is not implemented (only echo: false is accepted)",
    ),
    # Refused fields whose neutral value (OpenAI's default, sent explicitly by clients such as LangChain's
    # `OpenAI`) asks for nothing: neutral since ADR 005's amendment, refused at every other value.
    OpenAIField(
        "top_p",
        BOTH,
        "neutral",
        "nucleus sampling; `1` (OpenAI's default) keeps every token, a no-op",
        neutral=(1, 1.0),
        reason=_SAMPLING + " (only the neutral top_p: 1 is accepted)",
    ),
    OpenAIField(
        "presence_penalty",
        BOTH,
        "neutral",
        "per-token autoregressive penalty; `0` (OpenAI's default) is none",
        neutral=(0, 0.0),
        reason=_PENALTY + " (only the neutral presence_penalty: 0 is accepted)",
    ),
    OpenAIField(
        "frequency_penalty",
        BOTH,
        "neutral",
        "per-token autoregressive penalty; `0` (OpenAI's default) is none",
        neutral=(0, 0.0),
        reason=_PENALTY + " (only the neutral frequency_penalty: 0 is accepted)",
    ),
    OpenAIField(
        "logit_bias",
        BOTH,
        "neutral",
        "deferred; an empty map biases nothing",
        neutral=({},),
        reason="logit_bias is deferred (no current demand; only the empty logit_bias: {} is accepted)",
    ),
    OpenAIField(
        "top_logprobs",
        CHAT,
        "neutral",
        "deferred with `logprobs`",
        neutral=(0,),
        reason=_LOGPROBS + " (only top_logprobs: 0 is accepted)",
    ),
    OpenAIField(
        "tools",
        CHAT,
        "neutral",
        "function calling; an empty list offers no tool",
        neutral=([],),
        reason=_FUNCTIONS + " (only the empty tools: [] is accepted)",
    ),
    OpenAIField(
        "tool_choice",
        CHAT,
        "neutral",
        'function calling; `"none"` calls no tool',
        neutral=("none",),
        reason=_FUNCTIONS + ' (only tool_choice: "none" is accepted)',
    ),
    OpenAIField(
        "functions",
        CHAT,
        "deprecated alias",
        "of `tools`: refused like it",
        neutral=([],),
        reason=_FUNCTIONS + " (only the empty functions: [] is accepted)",
        alias_of="tools",
    ),
    OpenAIField(
        "function_call",
        CHAT,
        "deprecated alias",
        "of `tool_choice`: refused like it",
        neutral=("none",),
        reason=_FUNCTIONS + ' (only function_call: "none" is accepted)',
        alias_of="tool_choice",
    ),
    # --- rejected -------------------------------------------------------------------------------------------
    # Not neutral at 0: legacy `logprobs: 0` still asks for the chosen token's log-probability.
    OpenAIField("logprobs", COMPLETIONS, "rejected", "no log-probabilities", reason=_LOGPROBS),
    # Only null: with no tools, true and false both grant what cannot be used (and OpenAI refuses them too).
    OpenAIField("parallel_tool_calls", CHAT, "rejected", "function calling", reason=_FUNCTIONS),
    OpenAIField("audio", CHAT, "rejected", "audio output", reason=_TEXT_ONLY),
    OpenAIField(
        "prediction",
        CHAT,
        "rejected",
        "predicted outputs",
        reason="predicted outputs are not implemented (a diffusion analogue, a pre-filled canvas, is deferred)",
    ),
    OpenAIField(
        "web_search_options",
        CHAT,
        "rejected",
        "web search",
        reason="the server has no web search (it calls no outside service)",
    ),
    OpenAIField("moderation", CHAT, "rejected", "moderation", reason="the server runs no moderation model"),
    OpenAIField(
        "suffix",
        COMPLETIONS,
        "neutral",
        "insertion (text after the completion); an empty suffix inserts nothing",
        neutral=("",),
        reason="infilling is deferred (a diffusion model could fill a gap, but it is not offered yet; "
        'only the empty suffix: "" is accepted)',
    ),
    # --- inside messages ---------------------------------------------------------------------------------
    OpenAIField(
        "messages[].name",
        CHAT,
        "rejected",
        "participant names",
        reason="the models' chat templates have no participant names; put the name in the content",
    ),
    OpenAIField("messages[].role: tool, function", CHAT, "rejected", "tool results", reason=_FUNCTIONS),
    OpenAIField(
        "messages[].tool_calls",
        CHAT,
        "neutral",
        "an assistant's tool calls; an empty list is none",
        neutral=([],),
        reason=_FUNCTIONS + " (only the empty tool_calls: [] is accepted)",
    ),
    OpenAIField(
        "messages[].function_call",
        CHAT,
        "deprecated alias",
        "of `messages[].tool_calls`: rejected like it",
        reason=_FUNCTIONS,
        alias_of="messages[].tool_calls",
    ),
    OpenAIField("messages[].tool_call_id", CHAT, "rejected", "with role `tool`", reason=_FUNCTIONS),
    OpenAIField(
        "messages[].refusal",
        CHAT,
        "rejected",
        "an assistant's refusal",
        reason="refusals are not a message type here; send the text as content",
    ),
    OpenAIField("messages[].audio", CHAT, "rejected", "an assistant's earlier audio", reason=_TEXT_ONLY),
    OpenAIField(
        "messages[].content[]: image_url, input_audio, file, refusal",
        CHAT,
        "rejected",
        "non-text parts",
        reason=_TEXT_ONLY + ' (only {"type": "text", "text": ...} parts are accepted)',
    ),
    OpenAIField(
        "messages[].content[].prompt_cache_breakpoint",
        CHAT,
        "neutral",
        "any valid value is a no-op",
        neutral=(ANY,),
        reason=_NO_CACHE,
    ),
)

_BY_KEY = {(endpoint, f.name): f for f in OPENAI_FIELDS for endpoint in f.endpoints}


def openai_field(endpoint: Endpoint, name: str) -> OpenAIField:
    return _BY_KEY[(endpoint, name)]


def fields_of(endpoint: Endpoint) -> list[OpenAIField]:
    return [f for f in OPENAI_FIELDS if endpoint in f.endpoints]


def top_level_names(endpoint: Endpoint) -> set[str]:
    """The request body's own OpenAI fields for an endpoint (not those inside messages or options)."""
    return {f.name for f in fields_of(endpoint) if "." not in f.name and "[" not in f.name}


def markdown_table() -> str:
    """The table as the README and docs/api.md show it (tests check that both contain exactly this)."""
    status_shown = {"kept": "kept", "deviates": "**deviates**", "extension": "extension"}
    lines = ["| Field | Endpoints | Status | What it means here |", "|---|---|---|---|"]
    for row in OPENAI_FIELDS:
        where = "both" if row.endpoints == BOTH else next(iter(row.endpoints))
        status = status_shown.get(row.status, row.status)
        meaning = row.summary
        if row.neutral and ANY not in row.neutral:
            meaning += "; accepted: " + ", ".join(f"`{shown_json(v)}`" for v in row.neutral)
        if row.refuses_values:
            meaning += f"; otherwise 400: {row.reason}"
        lines.append(f"| `{row.name}` | {where} | {status} | {meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m schemas.fields: the table to paste into README.md and docs/api.md
    print(markdown_table())
