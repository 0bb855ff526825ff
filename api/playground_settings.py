"""What the playground's form offers, built from the server's own sources so that nothing is written twice.

The ranges, choices and help texts are the request schema's (`schemas.chat.ChatCompletionRequest`, the source
of /openapi.json too, itself derived from the knobs' definitions in engine.params); which switch a setting
needs is its knob's; the defaults are the engine's, resolved for the loaded model (its family's schedule and
metric, LLaDA2's block length); the canvas limit is the model's maximum sequence length. A default of None
means the server decides per request (block_length and num_denoising_steps follow the canvas, the seed is
drawn, the threshold is off or the family's): the page leaves such a field empty, and an empty field is
omitted from the request. The form offers only the knobs the loaded family takes: no token editing on LLaDA
or Dream, no schedule, metric, LocalLeap or approximate cache on LLaDA2.
"""

from __future__ import annotations

from typing import Any

from engine.params import DEFAULT_STEPS, KNOB, KNOBS, LOCAL_LEAP_DEFAULTS, SamplingParams
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
            "editing_threshold",
            "max_post_steps",
            "min_tokens_per_step",
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
    family = engine.sampler_defaults
    params = SamplingParams.for_model(family).with_model_defaults(family.block_schedule, family.confidence_metric)
    return {
        "max_tokens": params.gen_length,
        # None: decided per request (the canvas, one block; or a LLaDA checkpoint's declared length where it fits)
        "block_length": family.block_length if family.aligned_blocks else None,
        "num_denoising_steps": None,  # follows the canvas (or the threshold decides)
        "block_schedule": params.block_schedule,
        "confidence_metric": params.confidence_metric,
        "temperature": params.temperature,
        "seed": None,  # drawn per request, reported back
        "use_local_leap": False,
        **LOCAL_LEAP_DEFAULTS,
        "kv_cache": params.kv_cache,
        "confidence_threshold": None,  # off, or the family's (which depends on editing_threshold)
        "editing_threshold": None,  # off: LLaDA2.0's sampler
        "max_post_steps": KNOB["max_post_steps"].when_on,
        "min_tokens_per_step": KNOB["min_tokens_per_step"].when_on,
    }


def default_notes(engine: Any) -> dict[str, str]:
    """What the form shows in an empty field whose default is decided per request."""
    family = engine.sampler_defaults
    if family.aligned_blocks:
        return {
            "num_denoising_steps": "none: the threshold decides",
            "seed": "random",
            "confidence_threshold": f"{family.confidence_threshold}; {family.editing_confidence_threshold} editing",
            "editing_threshold": "off (LLaDA2.0's sampler)",
        }
    declared = family.block_length
    return {
        "block_length": (
            "the canvas"
            if declared is None
            else f"{declared}, or its smallest multiple that divides the canvas and the steps; else the canvas"
        ),
        "num_denoising_steps": f"min({DEFAULT_STEPS}, canvas)",
        "seed": "random",
        "confidence_threshold": "off",
    }


def offered(name: str, engine: Any) -> bool:
    """Whether the form offers a field on this engine's family: not a knob the family refuses (its spec's
    families, or the family's fixed knobs and what they switch on)."""
    spec = KNOB.get(name)
    if spec is None:
        return True
    if spec.families is not None and engine.family not in spec.families:
        return False
    fixed = engine.sampler_defaults.fixed_knobs
    return name not in fixed and spec.requires not in fixed


def page_settings(engine: Any) -> dict[str, Any]:
    """The JSON the playground loads first: the model, its stop tokens, and the form's controls."""
    properties = ChatCompletionRequest.model_json_schema()["properties"]
    defaults = resolved_defaults(engine)
    # The schema bounds the canvas only below (the upper bound depends on the model and the prompt): the form
    # shows the model's, and the API reports the exact one for a given prompt.
    overrides: dict[str, dict[str, Any]] = {"max_tokens": {"maximum": engine.max_sequence_length}}
    for name, note in default_notes(engine).items():
        overrides.setdefault(name, {})["default_note"] = note
    groups = [
        {
            "title": title,
            "controls": [
                control(name, properties[name], defaults[name], **overrides.get(name, {}))
                for name in names
                if offered(name, engine)
            ],
        }
        for title, names in CONTROL_GROUPS
    ]
    tokenizer = engine.tokenizer
    return {
        "model": engine.model_name,
        "family": engine.family,
        # Block diffusion: blocks aligned to position 0 of the prompt, the canvas rounded up to whole blocks.
        "aligned_blocks": engine.sampler_defaults.aligned_blocks,
        "max_sequence_length": engine.max_sequence_length,
        "stop_tokens": [{"token_id": i, "text": tokenizer.token_text(i)} for i in sorted(tokenizer.stop_ids)],
        "groups": groups,
    }
