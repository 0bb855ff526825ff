"""Every sampler knob is defined once (engine.params) and everything that shows one is derived from it: the
request fields of both endpoints, their /docs text, the resolved `diffusion` object, BentoML's native API
arguments, the playground's form, the tables of README.md and docs/api.md. Also the knob spec's own parts
(families, switches) and the typed prompt of the Python API."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import server.native as native
from api.playground_settings import REQUIRES
from engine import InvalidParameter, Prompt, SamplingParams
from engine.params import KNOB, KNOBS, knob, knobs_of
from schemas.chat import ChatCompletionRequest, ResolvedDiffusion, parse_chat_request
from schemas.completions import CompletionRequest
from schemas.knobs import EXTENSION_FIELDS, REQUEST_KNOBS, TABLES, native_argument
from tests.fixture_paths import REPO_ROOT


@pytest.mark.parametrize(("page", "table"), [(p, t) for p, ts in TABLES.items() for t in ts], ids=lambda x: str(x))
def test_the_readme_and_the_api_reference_print_the_generated_tables(page, table):
    assert table() in (REPO_ROOT / page).read_text(), f"{page}: paste the output of `python -m schemas.knobs`"


def test_every_knob_a_request_can_set_is_a_field_of_both_endpoints_and_of_the_diffusion_object():
    settable = {spec.name for spec in KNOBS if spec.http in ("extension", "openai")}
    assert settable == {spec.name for spec in REQUEST_KNOBS}
    for model in (ChatCompletionRequest, CompletionRequest):
        assert settable <= set(model.model_fields)
    reported = {spec.name for spec in KNOBS if spec.http is not None}
    assert reported | {"num_blocks", "attention_backend", "num_forward_passes"} == set(ResolvedDiffusion.model_fields)
    assert {spec.name for spec in KNOBS if spec.http == "extension"} <= set(EXTENSION_FIELDS)


def test_the_docs_of_a_request_field_are_its_knobs():
    properties = ChatCompletionRequest.model_json_schema()["properties"]
    for spec in REQUEST_KNOBS:
        assert properties[spec.name]["description"] == spec.description(), spec.name
    # The range is shown, not enforced, by the schema: SamplingParams checks it (once).
    steps = next(m for m in properties["num_denoising_steps"]["anyOf"] if m.get("type") == "integer")
    assert (steps["minimum"], steps["maximum"]) == (1, KNOB["num_denoising_steps"].maximum)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "num_denoising_steps": 1000000}'
    assert parse_chat_request(body).num_denoising_steps == 10**6
    with pytest.raises(InvalidParameter, match="num_denoising_steps: must be between 1 and 512"):
        parse_chat_request(body).sampling_params()


def test_the_native_api_takes_its_arguments_from_the_knobs():
    def shown(annotation) -> tuple:  # FieldInfo compares by identity: compare what BentoML reads
        return annotation.__origin__, annotation.__metadata__[0].description

    for alias, name in [("Steps", "num_denoising_steps"), ("KVCache", "kv_cache"), ("MaxTokens", "gen_length")]:
        assert shown(getattr(native, alias)) == shown(native_argument(name))
    description = native.Steps.__metadata__[0].description
    assert description == (
        "Forward passes over the canvas. Accepts integer 1–512; default min(128, gen_length); llada2: unset."
    )


def test_the_playground_enables_a_setting_with_the_switch_its_knob_requires():
    assert REQUIRES == {spec.name: spec.requires for spec in KNOBS if spec.requires}


@pytest.mark.parametrize("name", ["temperature", "confidence_threshold", "local_leap_anchor_threshold"])
def test_a_number_that_is_not_a_number_is_out_of_every_range(name):
    with pytest.raises(InvalidParameter, match=f"{name}: must be"):
        SamplingParams(**{name: float("nan")}, use_local_leap=name.startswith("local_leap"))


def test_a_knob_applies_to_the_families_its_spec_names():
    SamplingParams(kv_cache="dual").check_family("llada")
    SamplingParams(kv_cache="dual").check_family("dream")
    SamplingParams().check_family("llada2")  # the default is every family's
    with pytest.raises(InvalidParameter, match='kv_cache: is not supported for llada2 models yet; use "none"'):
        SamplingParams(kv_cache="dual").check_family("llada2")


@dataclass(frozen=True)
class WithAKnob(SamplingParams):
    """A knob added the way docs/architecture.md says: one field with its spec."""

    edit_radius: int | None = knob(
        "integer", minimum=1, maximum=8, requires="use_local_leap", when_on=2, families=("llada",), help="a knob"
    )


def test_a_new_knob_is_one_field_with_its_spec():
    spec = knobs_of(WithAKnob)[-1]
    assert (spec.name, spec.type_doc, spec.default_shown) == ("edit_radius", "integer 1–8", "2")
    assert "Only with `use_local_leap: true`" in spec.description() and "Only for llada models" in spec.description()
    assert WithAKnob(use_local_leap=True).edit_radius == 2 and WithAKnob().edit_radius is None
    with pytest.raises(InvalidParameter, match="edit_radius: must be between 1 and 8, got 9"):
        WithAKnob(use_local_leap=True, edit_radius=9)
    with pytest.raises(InvalidParameter, match="edit_radius: is only allowed together with use_local_leap"):
        WithAKnob(edit_radius=3)
    WithAKnob(use_local_leap=True).check_family("dream")  # left at its default: nothing to refuse
    with pytest.raises(InvalidParameter, match="edit_radius: is not supported for dream models"):
        WithAKnob(use_local_leap=True, edit_radius=3).check_family("dream")


# --- the typed prompt -------------------------------------------------------------------------------------


def test_a_prompt_is_one_of_three_kinds_given_once():
    messages = [{"role": "user", "content": "hi"}]
    assert Prompt.of(messages=messages) == Prompt.chat(messages)
    assert Prompt.of(prompt_token_ids=[5, 6]) == Prompt.token_ids([5, 6])
    assert Prompt.of("raw") == Prompt.text("raw") and Prompt.of(Prompt.text("raw")) == Prompt.text("raw")
    assert [Prompt.chat(messages).field, Prompt.text("x").field, Prompt.token_ids([1]).field] == [
        "messages",
        "prompt",
        "prompt_token_ids",
    ]
    with pytest.raises(ValueError, match="exactly one of"):
        Prompt.of("raw", messages=messages)
    with pytest.raises(ValueError, match="exactly one of"):
        Prompt.of()
    with pytest.raises(InvalidParameter) as refused:
        Prompt.of(7)
    assert refused.value.field == "prompt"


def test_the_engine_takes_a_prompt_or_its_keywords(fixture_engine):
    params = SamplingParams(gen_length=8, seed=1)
    messages = [{"role": "user", "content": "hi"}]
    by_keyword = fixture_engine.generate(messages=messages, params=params)
    assert fixture_engine.generate(Prompt.chat(messages), params) == by_keyword
    assert fixture_engine.generate(prompt_token_ids=[400, 5], params=params) == fixture_engine.generate(
        Prompt.token_ids([400, 5]), params
    )
    assert fixture_engine.generate(prompt="hi", params=params) == fixture_engine.generate("hi", params)
