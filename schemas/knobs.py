"""The HTTP side of the sampler knobs, derived from their one definition (`engine.params.KNOBS`).

From each knob's spec come: its request field (JSON type, the range /docs shows, the description), its
field in the resolved `diffusion` object, its argument of BentoML's native API, and its rows in the tables
of README.md and docs/api.md (`python -m schemas.knobs` prints them; tests/test_knobs.py checks the pages).

The request fields only type the JSON (strict types, the choices): ranges and the rules between knobs are
checked once, by `engine.SamplingParams`, whose `InvalidParameter` the HTTP layer reports as a 400 on the
field. Two extension fields are the request's alone and not sampler knobs (`REQUEST_ONLY`): `target_length`
sets the canvas like `max_tokens`, and `attention_backend` accepts only the one backend there is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from engine.params import DEFAULT_GEN_LENGTH, KNOB, KNOBS, Knob

REQUEST_ONLY: tuple[Knob, ...] = (
    Knob(
        "integer",
        None,
        minimum=1,
        default_doc=f"`max_tokens` ({DEFAULT_GEN_LENGTH})",
        help="the canvas size, directly",
        doc="Sets the canvas size (gen_length) directly; the prompt plus the canvas must fit the model's maximum "
        "sequence length. With `max_tokens` also given, the two must be equal.",
        name="target_length",
    ),
    Knob(
        "choice",
        "sdpa",
        choices=("sdpa",),
        help='the attention implementation; "fa2" is deferred and refused',
        doc='The reference, deterministic attention. "fa2" is recognised but deferred until a FlashAttention-2 '
        "build for SM 12.0 is in CI: 400 `invalid_value`.",
        name="attention_backend",
    ),
)
# The sampler knobs a request sets under their own name (the canvas size goes by max_tokens and its kin).
REQUEST_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.http in ("extension", "openai"))
EXTENSION_KNOBS: tuple[Knob, ...] = REQUEST_ONLY + tuple(k for k in KNOBS if k.http == "extension")
# Every field of both request models that is not an OpenAI field (schemas/fields.py).
EXTENSION_FIELDS: tuple[str, ...] = tuple(k.name for k in EXTENSION_KNOBS)
_REQUEST_ONLY = {k.name: k for k in REQUEST_ONLY}


def json_type(spec: Knob) -> Any:
    """The JSON value a knob takes, as a Python type."""
    if spec.kind == "choice":
        return Literal[spec.choices]  # type: ignore[valid-type]
    return {"integer": int, "number": float, "switch": bool, "strings": str | list[str]}[spec.kind]


def range_schema(spec: Knob) -> Any:
    """Adds the knob's range to its JSON schema (the non-null members), for /docs and clients: a number's bounds,
    how many non-empty strings. The range is documented, not enforced, here: `SamplingParams` enforces it, once."""

    def number(bound: int | float) -> int | float:
        return int(bound) if isinstance(bound, float) and bound.is_integer() else bound  # JSON's 2, not 2.0

    bounds: dict[str, Any] = {}
    if isinstance(spec.minimum, (int, float)):
        bounds["exclusiveMinimum" if spec.exclusive_minimum else "minimum"] = number(spec.minimum)
    if isinstance(spec.maximum, (int, float)):
        bounds["maximum"] = number(spec.maximum)

    def add(schema: dict[str, Any]) -> None:
        for member in schema.get("anyOf", [schema]):
            if member.get("type") in ("integer", "number"):
                member.update(bounds)
            elif spec.kind == "strings" and member.get("type") == "string":
                member["minLength"] = 1
            elif spec.kind == "strings" and member.get("type") == "array":
                member.update(maxItems=spec.max_items, items={"type": "string", "minLength": 1})

    return add


def request_field(spec: Knob) -> tuple[Any, Any]:
    """A knob's field of the request model, as `pydantic.create_model` takes it: null means "the default"."""
    return json_type(spec) | None, Field(None, description=spec.description(), json_schema_extra=range_schema(spec))


def request_fields() -> dict[str, tuple[Any, Any]]:
    return {spec.name: request_field(spec) for spec in REQUEST_KNOBS}


def request_only(name: str) -> Knob:
    return _REQUEST_ONLY[name]


def resolved_fields() -> dict[str, tuple[Any, Any]]:
    """The `diffusion` object's fields: every knob a request can set, as it resolved, in the knobs' order, with
    the block count and the attention backend beside the knobs they follow."""
    out: dict[str, tuple[Any, Any]] = {}
    for spec in KNOBS:
        if spec.http is None:
            continue
        kind = {"choice": str, "strings": list[str]}.get(spec.kind) or json_type(spec)
        nullable = spec.default is None and not spec.resolved
        out[spec.name] = (kind | None if nullable else kind, Field(description=spec.help))
        if spec.name == "block_length":
            out["num_blocks"] = (int, Field(description="gen_length / block_length (rounded up on llada2)"))
        if spec.name == "seed":
            out["attention_backend"] = (str, Field("sdpa", description="the attention backend that ran"))
    return out


def native_argument(name: str) -> Any:
    """The annotation of a knob's argument in BentoML's native API (service.py): None means "the default"."""
    spec = KNOB[name]
    return Annotated[json_type(spec) | None, Field(description=spec.summary())]


# --- the tables of README.md and docs/api.md ------------------------------------------------------------


def _conditions(spec: Knob) -> str:
    text = f"; only with `{spec.requires}`" if spec.requires else ""
    return text + (f"; only for {' and '.join(spec.families)} models" if spec.families else "")


def readme_extension_table() -> str:
    """README.md's short table of the extension fields."""
    lines = ["| Field | What it means here |", "|---|---|"]
    for spec in EXTENSION_KNOBS:
        lines.append(
            f"| `{spec.name}` | {spec.help} ({spec.type_doc}; default {spec.default_shown}{_conditions(spec)}) |"
        )
    return "\n".join(lines)


def api_extension_table() -> str:
    """docs/api.md's table of the extension fields: type, range, default and the whole effect."""
    lines = ["| Field | Type and range | Default | Effect |", "|---|---|---|---|"]
    for spec in EXTENSION_KNOBS:
        lines.append(f"| `{spec.name}` | {spec.type_doc} | {spec.default_shown} | {spec.effect()} |")
    return "\n".join(lines)


def python_table() -> str:
    """README.md's table of every `SamplingParams` field (the Python API)."""
    lines = ["| `SamplingParams` field | Type and range | Default | What it does |", "|---|---|---|---|"]
    for spec in KNOBS:
        lines.append(f"| `{spec.name}` | {spec.type_doc} | {spec.default_shown} | {spec.help}{_conditions(spec)} |")
    return "\n".join(lines)


TABLES = {
    "README.md": (readme_extension_table, python_table),
    "docs/api.md": (api_extension_table,),
}

if __name__ == "__main__":  # python -m schemas.knobs: the tables to paste into README.md and docs/api.md
    for page, tables in TABLES.items():
        for table in tables:
            print(f"<!-- {page}: {table.__name__} -->\n{table()}\n")
