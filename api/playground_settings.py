"""What the playground's form offers, built from the server's own sources so that nothing is written twice.

The ranges, choices and help texts are the request schema's (`schemas.chat.ChatCompletionRequest`, the source
of /openapi.json too, itself derived from the knobs' definitions in engine.params); which switch a setting
needs is its knob's; the defaults are the engine's, resolved for the loaded model (its family's schedule and
metric); the canvas limit is the model's maximum sequence length. A default of None means the server decides
per request (block_length and num_denoising_steps follow the canvas, the seed is drawn, the threshold is
off): the page leaves such a field empty, and an empty field is omitted from the request.
"""

from __future__ import annotations

from typing import Any

from engine.params import DEFAULT_STEPS, KNOBS, SamplingParams
from schemas.chat import ChatCompletionRequest

# The request fields the page offers, grouped as the form shows them.
CONTROL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Canvas", ("max_tokens", "block_length", "num_denoising_steps")),
    ("Sampler", ("block_schedule", "confidence_metric", "temperature", "seed")),
    (
        "Acceleration",
        (
            "use_local_leap",
            "local_leap_anchor_threshold",
            "local_leap_neighbor_threshold",
            "local_leap_radius",
            "kv_cache",
            "confidence_threshold",
        ),
    ),
)
# Fields the API refuses unless a switch is on: the page enables (and sends) them only then.
REQUIRES = {spec.name: spec.requires for spec in KNOBS if spec.requires}
_SCHEMA_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum")


def control(name: str, schema: dict[str, Any], default: Any, **overrides: Any) -> dict[str, Any]:
    """One form control from the field's JSON schema: its non-null type, its range or choices, its help."""
    (accepted,) = [option for option in schema.get("anyOf", [schema]) if option.get("type") != "null"]
    spec = {
        "name": name,
        "type": "enum" if "enum" in accepted else accepted["type"],
        "default": default,
        "description": schema.get("description", ""),
        **{key: accepted[key] for key in _SCHEMA_KEYS if key in accepted},
        **overrides,
    }
    if name in REQUIRES:
        spec["requires"] = REQUIRES[name]
    return spec


def resolved_defaults(engine: Any) -> dict[str, Any]:
    """What each offered field is when a request omits it, on this engine (None: decided per request)."""
    family = engine.model.config.sampler_defaults
    # LocalLeap on only so that its thresholds resolve; otherwise a request that names nothing.
    params = SamplingParams(use_local_leap=True).with_model_defaults(family.block_schedule, family.confidence_metric)
    return {
        "max_tokens": params.gen_length,
        "block_length": None,  # the canvas (one block)
        "num_denoising_steps": None,  # follows the canvas
        "block_schedule": params.block_schedule,
        "confidence_metric": params.confidence_metric,
        "temperature": params.temperature,
        "seed": None,  # drawn per request, reported back
        "use_local_leap": False,
        "local_leap_anchor_threshold": params.local_leap_anchor_threshold,
        "local_leap_neighbor_threshold": params.local_leap_neighbor_threshold,
        "local_leap_radius": params.local_leap_radius,
        "kv_cache": params.kv_cache,
        "confidence_threshold": params.confidence_threshold,  # off
    }


def default_notes() -> dict[str, str]:
    """What the form shows in an empty field whose default is decided per request."""
    return {
        "block_length": "the canvas",
        "num_denoising_steps": f"min({DEFAULT_STEPS}, canvas)",
        "seed": "random",
        "confidence_threshold": "off",
    }


def page_settings(engine: Any) -> dict[str, Any]:
    """The JSON the playground loads first: the model, its stop tokens, and the form's controls."""
    properties = ChatCompletionRequest.model_json_schema()["properties"]
    defaults = resolved_defaults(engine)
    # The schema bounds the canvas only below (the upper bound depends on the model and the prompt): the form
    # shows the model's, and the API reports the exact one for a given prompt.
    overrides: dict[str, dict[str, Any]] = {"max_tokens": {"maximum": engine.max_sequence_length}}
    for name, note in default_notes().items():
        overrides.setdefault(name, {})["default_note"] = note
    groups = [
        {
            "title": title,
            "controls": [control(name, properties[name], defaults[name], **overrides.get(name, {})) for name in names],
        }
        for title, names in CONTROL_GROUPS
    ]
    tokenizer = engine.tokenizer
    return {
        "model": engine.model_name,
        "family": engine.family,
        "max_sequence_length": engine.max_sequence_length,
        "stop_tokens": [{"token_id": i, "text": tokenizer.token_text(i)} for i in sorted(tokenizer.stop_ids)],
        "groups": groups,
    }
