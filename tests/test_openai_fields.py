"""The classification of every OpenAI request field (schemas/fields.py), against OpenAI's own field list
(the installed `openai` SDK), the request models, the server's answers, and the docs that print it."""

from __future__ import annotations

import logging
import typing

import pytest

from schemas.chat import ChatCompletionRequest, ChatMessage, StreamOptions, TextContentPart, parse_chat_request
from schemas.completions import CompletionRequest
from schemas.fields import ANY, OPENAI_FIELDS, markdown_table, openai_field, top_level_names
from schemas.knobs import EXTENSION_FIELDS
from tests.fixture_paths import REPO_ROOT

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
SMALL = {"max_tokens": 4}
NOT_OPENAI = {"top_k"}  # classified because vLLM-style clients send it, though OpenAI has no such field


def typed_dict_keys(cls) -> set[str]:
    return set(cls.__required_keys__ | cls.__optional_keys__)


def literal_value(typed_dict, key: str) -> str:
    """The one value of a `Required[Literal["x"]]` key."""
    hint = typing.get_type_hints(typed_dict)[key]  # without extras: Required[...] unwrapped
    return typing.get_args(hint)[0]


def sdk_module(name: str):
    import importlib

    return importlib.import_module(f"openai.types.{name}")


# --- OpenAI's field list (the installed SDK is generated from OpenAI's API specification) ---------------


@pytest.mark.parametrize(
    ("endpoint", "module"), [("chat", "chat.completion_create_params"), ("completions", "completion_create_params")]
)
def test_every_field_openai_defines_is_classified(endpoint, module):
    params = sdk_module(module)
    openai_fields = typed_dict_keys(params.CompletionCreateParamsNonStreaming) | typed_dict_keys(
        params.CompletionCreateParamsStreaming
    )
    classified = top_level_names(endpoint)
    assert openai_fields - classified == set(), "OpenAI fields that would be unknown_parameter"
    assert classified - openai_fields - NOT_OPENAI == set(), "classified fields that OpenAI does not have"


def test_every_message_field_openai_defines_is_classified():
    chat = sdk_module("chat")
    classified = {f.name.removeprefix("messages[].") for f in OPENAI_FIELDS if f.name.startswith("messages[].")}
    declared = set(ChatMessage.model_fields)
    for param in typing.get_args(chat.ChatCompletionMessageParam):
        for field in typed_dict_keys(param) - {"role", "content"}:
            assert field in classified and field in declared, (param.__name__, field)
    roles = {literal_value(param, "role") for param in typing.get_args(chat.ChatCompletionMessageParam)}
    assert roles == set(typing.get_args(ChatMessage.model_fields["role"].annotation))
    part_types = {literal_value(part, "type") for part in typing.get_args(chat.ChatCompletionContentPartParam)}
    part_types.add("refusal")  # the assistant's own part type
    refused_parts = set(
        openai_field("chat", "messages[].content[]: image_url, input_audio, file, refusal")
        .name.split(": ")[1]
        .split(", ")
    )
    assert part_types == refused_parts | {"text"}
    assert typed_dict_keys(chat.ChatCompletionContentPartTextParam) == set(TextContentPart.model_fields)
    assert typed_dict_keys(chat.ChatCompletionStreamOptionsParam) == set(StreamOptions.model_fields)


@pytest.mark.parametrize(("endpoint", "model"), [("chat", ChatCompletionRequest), ("completions", CompletionRequest)])
def test_the_request_models_declare_exactly_the_table_and_the_extension_fields(endpoint, model):
    assert set(model.model_fields) == top_level_names(endpoint) | set(EXTENSION_FIELDS)


def test_the_readme_and_the_api_reference_print_the_table():
    table = markdown_table()
    for page in ("README.md", "docs/api.md"):
        text = (REPO_ROOT / page).read_text()
        assert table in text, f"{page}: paste the output of `python -m schemas.fields`"
        for name in EXTENSION_FIELDS:
            assert f"`{name}`" in text, (page, name)


# --- what the server does with each row ---------------------------------------------------------------


def post(client, endpoint: str, **fields):
    if endpoint == "chat":
        return client.post(CHAT_URL, json={"messages": MESSAGES, **SMALL, **fields})
    return client.post(COMPLETIONS_URL, json={"prompt": "What is 2 plus 3?", **SMALL, **fields})


def top_level_rows(endpoint: str, predicate) -> list:
    names = sorted(top_level_names(endpoint))
    return [(endpoint, openai_field(endpoint, n)) for n in names if predicate(openai_field(endpoint, n))]


NEUTRAL = [
    (endpoint, row.name, value)
    for endpoint in ("chat", "completions")
    for _, row in top_level_rows(endpoint, lambda r: r.neutral and ANY not in r.neutral)
    for value in row.neutral
] + [
    ("chat", "prompt_cache_options", {"mode": "explicit", "ttl": "30m"}),
    ("chat", "prompt_cache_retention", "24h"),
]


@pytest.mark.parametrize(("endpoint", "field", "value"), NEUTRAL, ids=[f"{e}:{f}={v!r}" for e, f, v in NEUTRAL])
def test_neutral_values_are_no_ops(service_client, endpoint, field, value):
    plain = post(service_client, endpoint, seed=1)
    response = post(service_client, endpoint, seed=1, **{field: value})
    assert response.status_code == 200, response.text
    assert response.json()["choices"] == plain.json()["choices"]
    assert response.json()["diffusion"] == plain.json()["diffusion"]


# One value per refusing field that is not neutral; the test below insists that every such field has one.
REFUSED = {
    ("chat", "n"): 2,
    ("chat", "top_k"): 40,
    ("chat", "logprobs"): True,
    ("chat", "reasoning_effort"): "high",
    ("chat", "response_format"): {"type": "json_object"},
    ("chat", "modalities"): ["text", "audio"],
    ("chat", "store"): True,
    ("chat", "service_tier"): "flex",
    ("chat", "verbosity"): "low",
    ("chat", "top_p"): 0.95,
    ("chat", "presence_penalty"): 0.5,
    ("chat", "frequency_penalty"): -0.5,
    ("chat", "logit_bias"): {"5": 1},
    ("chat", "top_logprobs"): 2,
    ("chat", "tools"): [{"type": "function", "function": {"name": "f"}}],
    ("chat", "tool_choice"): "auto",
    ("chat", "parallel_tool_calls"): False,
    ("chat", "functions"): [{"name": "f"}],
    ("chat", "function_call"): "auto",
    ("chat", "audio"): {"voice": "alloy", "format": "wav"},
    ("chat", "prediction"): {"type": "content", "content": "x"},
    ("chat", "web_search_options"): {},
    ("chat", "moderation"): {"model": "omni-moderation-latest"},
    ("completions", "n"): 3,
    ("completions", "top_k"): 2,
    ("completions", "best_of"): 2,
    ("completions", "echo"): True,
    ("completions", "logprobs"): 0,
    ("completions", "suffix"): "end",
    ("completions", "top_p"): 0.9,
    ("completions", "presence_penalty"): 1,
    ("completions", "frequency_penalty"): 0.1,
    ("completions", "logit_bias"): {"50256": -100},
}


def test_every_refusing_field_has_a_refused_example():
    refusing = {
        (e, row.name) for e in ("chat", "completions") for _, row in top_level_rows(e, lambda r: r.refuses_values)
    }
    assert refusing == set(REFUSED)


@pytest.mark.parametrize(("key", "value"), REFUSED.items(), ids=[f"{e}:{f}={v!r}" for (e, f), v in REFUSED.items()])
def test_refused_value_is_a_400_naming_the_field_and_why(service_client, key, value):
    endpoint, field = key
    response = post(service_client, endpoint, **{field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("unsupported_parameter", field, "invalid_request_error")
    row = openai_field(endpoint, field)
    assert error["message"] == row.rejection_message()
    assert "ADR 005, docs/adr/005-openai-compatible-api.md" in error["message"] and row.reason in error["message"]


# A neutral value of another JSON type, or a value next to it, asks for something else (or is a mistake).
NEAR_NEUTRAL = [
    ("chat", "top_p", True),
    ("chat", "top_p", "1"),
    ("completions", "top_p", 0.999),
    ("chat", "presence_penalty", False),
    ("completions", "frequency_penalty", 1e-9),
    ("chat", "logit_bias", []),
    ("chat", "tools", {}),
    ("chat", "tool_choice", "None"),
    ("chat", "top_logprobs", False),
    ("completions", "suffix", " "),
]


@pytest.mark.parametrize(
    ("endpoint", "field", "value"), NEAR_NEUTRAL, ids=[f"{e}:{f}={v!r}" for e, f, v in NEAR_NEUTRAL]
)
def test_values_beside_the_neutral_one_are_refused(service_client, endpoint, field, value):
    response = post(service_client, endpoint, **{field: value})
    assert response.status_code == 400, response.text
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("unsupported_parameter", field)


def test_the_neutral_values_langchains_legacy_openai_class_sends_are_accepted(service_client):
    # langchain_openai.OpenAI's defaults, as it sends them (tests/test_real_clients.py calls the class itself).
    defaults = {"temperature": 0.7, "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0, "n": 1}
    response = post(service_client, "completions", **defaults, seed=None, logprobs=None)
    assert response.status_code == 200, response.text
    assert post(service_client, "chat", **defaults, logit_bias={}, tools=[], tool_choice="none").status_code == 200


MESSAGE_REFUSALS = [
    ({"role": "user", "content": "hi", "name": "bob"}, "messages[0].name"),
    ({"role": "tool", "content": "4", "tool_call_id": "c1"}, "messages[0].role"),
    ({"role": "function", "content": "4", "name": "f"}, "messages[0].role"),
    ({"role": "assistant", "content": "x", "tool_calls": [{"id": "c1", "type": "function"}]}, "messages[0].tool_calls"),
    (
        {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}},
        "messages[0].function_call",
    ),
    ({"role": "assistant", "content": "x", "refusal": "no"}, "messages[0].refusal"),
    ({"role": "assistant", "content": "x", "audio": {"id": "a1"}}, "messages[0].audio"),
    ({"role": "user", "content": "x", "tool_call_id": "c1"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}, "messages[0].content"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "messages[0].content"),
    ({"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}, "messages[0].content"),
    ({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, "messages[0].content"),
]


@pytest.mark.parametrize(
    ("message", "param"), MESSAGE_REFUSALS, ids=[p + str(i) for i, (_, p) in enumerate(MESSAGE_REFUSALS)]
)
def test_openai_message_fields_without_meaning_here_are_refused_with_a_reason(service_client, message, param):
    response = service_client.post(CHAT_URL, json={"messages": [message], **SMALL})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert "ADR 005" in error["message"]


def test_null_message_fields_and_cache_breakpoints_are_accepted(service_client):
    parts = [{"type": "text", "text": "What is 2 plus 3?", "prompt_cache_breakpoint": {"mode": "explicit"}}]
    message = {"role": "user", "content": parts, "name": None, "tool_calls": None, "refusal": None}
    assert service_client.post(CHAT_URL, json={"messages": [message], **SMALL}).status_code == 200
    earlier = {"role": "assistant", "content": "5", "tool_calls": []}  # what some clients send for "no calls"
    messages = [*MESSAGES, earlier, {"role": "user", "content": "And 3 plus 4?"}]
    assert service_client.post(CHAT_URL, json={"messages": messages, **SMALL}).status_code == 200


def test_developer_messages_are_system_messages(service_client):
    def messages(role):
        return [{"role": role, "content": "Answer briefly."}, *MESSAGES]

    assert parse_chat_request(b'{"messages": [{"role": "developer", "content": "x"}]}').engine_messages() == [
        {"role": "system", "content": "x"}
    ]
    as_developer = service_client.post(CHAT_URL, json={"messages": messages("developer"), **SMALL, "seed": 1}).json()
    as_system = service_client.post(CHAT_URL, json={"messages": messages("system"), **SMALL, "seed": 1}).json()
    assert as_developer["choices"] == as_system["choices"] and as_developer["usage"] == as_system["usage"]


def test_end_user_ids_and_metadata_are_logged_with_the_request(service_client, caplog):
    fields = {"user": "u1", "safety_identifier": "s1", "prompt_cache_key": "k1", "metadata": {"team": "a"}}
    with caplog.at_level(logging.INFO, logger="dllm_serve"):
        assert post(service_client, "chat", **fields).status_code == 200
    line = next(r.getMessage() for r in caplog.records if '"POST /v1/chat/completions" 200' in r.getMessage())
    assert "user='u1' safety_identifier='s1' prompt_cache_key='k1' metadata={'team': 'a'}" in line


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata", {f"k{i}": "v" for i in range(17)}),
        ("metadata", {"k" * 65: "v"}),
        ("metadata", {"k": "v" * 513}),
        ("metadata", {"k": 1}),
        ("safety_identifier", "s" * 129),
        ("prompt_cache_options", {"mode": "sometimes"}),
        ("prompt_cache_retention", "forever"),
    ],
    ids=["17 keys", "long key", "long value", "not a string", "long id", "bad mode", "bad retention"],
)
def test_logged_and_no_op_fields_are_still_validated(service_client, field, value):
    response = post(service_client, "chat", **{field: value})
    assert response.status_code == 400, response.text
    assert (response.json()["error"]["code"], response.json()["error"]["param"].split(".")[0]) == (
        "invalid_value",
        field,
    )
