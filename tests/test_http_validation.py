"""The request rules of ADR 005 and of docs/design.md ("HTTP contract"), in-process: every rejection, every
extension field bound, strict typing, messages, malformed JSON. Valid requests use tiny canvases so the
engine work is negligible."""

from __future__ import annotations

import pytest

URL = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
SMALL = {"max_tokens": 4}  # a 4-token canvas: valid requests cost four tiny forward passes


def post(client, body: dict | None = None, content: bytes | None = None, **headers):
    if content is not None:
        return client.post(URL, content=content, headers={"Content-Type": "application/json", **headers})
    return client.post(URL, json=body, headers=headers)


def chat(client, **fields):
    return post(client, {"messages": MESSAGES, **SMALL, **fields})


def assert_error(response, status: int, code: str, param: str | None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]
    return error


# --- OpenAI fields ADR 005 rejects --------------------------------------------------------------------

ADR_REJECTED = [
    ("top_p", 0.9),
    ("top_p", 0.9),  # any value but the neutral 1 (ADR 005's amendment)
    ("top_p", True),  # a boolean is not the number 1
    ("top_k", 5),
    ("top_k", 1.0),  # a float is not the neutral integer 1
    ("top_k", 0),
    ("presence_penalty", False),  # a boolean is not the number 0
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("n", 2),
    ("n", True),  # a boolean is not the integer 1
    ("n", 1.0),
    ("logit_bias", []),  # not the empty map
    ("logit_bias", {"50256": -100}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "auto"),
    ("tool_choice", "required"),
    ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
    ("logprobs", True),
    ("logprobs", 0),  # not the neutral false
    ("top_logprobs", 0.0),  # a float is not the neutral integer 0
    ("top_logprobs", 5),
]


@pytest.mark.parametrize(("field", "value"), ADR_REJECTED, ids=[f"{f}={v!r}" for f, v in ADR_REJECTED])
def test_adr_rejected_field_is_a_400_citing_the_adr(service_client, field, value):
    error = assert_error(chat(service_client, **{field: value}), 400, "unsupported_parameter", field)
    assert "ADR 005" in error["message"]
    assert field in error["message"]


def test_adr_rejection_explains_why(service_client):
    message = chat(service_client, top_p=0.9).json()["error"]["message"]
    assert message.startswith("top_p is not supported (ADR 005, docs/adr/005-openai-compatible-api.md): ")
    assert "temperature" in message
    assert "function calling" in chat(service_client, tool_choice="auto").json()["error"]["message"]


def test_neutral_and_null_values_of_rejected_fields_are_accepted(service_client):
    nulls = {field: None for field, _ in ADR_REJECTED}
    neutral = {"n": 1, "top_k": 1, "logprobs": False, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0.0}
    neutral |= {"logit_bias": {}, "tools": [], "tool_choice": "none", "functions": [], "top_logprobs": 0}
    response = chat(service_client, **{**nulls, **neutral})
    assert response.status_code == 200, response.text


# --- unknown fields -----------------------------------------------------------------------------------

# Fields OpenAI's Chat Completions does not have (every field it has is classified: tests/test_openai_fields.py).
UNKNOWN = ["foo", "best_of", "echo", "suffix", "prompt", "guided_json", "repetition_penalty", "min_p"]


@pytest.mark.parametrize("field", UNKNOWN)
def test_unknown_field_is_a_400_unknown_parameter(service_client, field):
    error = assert_error(chat(service_client, **{field: 1}), 400, "unknown_parameter", field)
    assert error["message"] == f"Unknown parameter: '{field}'."


def test_unknown_nested_fields_are_rejected(service_client):
    messages = [{"role": "user", "content": "hi", "nickname": "bob"}]
    assert_error(post(service_client, {"messages": messages}), 400, "unknown_parameter", "messages[0].nickname")
    options = {"include_usage": True, "continuous_usage_stats": True}
    response = chat(service_client, stream=True, stream_options=options)
    assert_error(response, 400, "unknown_parameter", "stream_options.continuous_usage_stats")


def test_extension_fields_are_top_level_not_extra_body(service_client):
    assert_error(chat(service_client, extra_body={"num_denoising_steps": 4}), 400, "unknown_parameter", "extra_body")


# --- strict JSON types --------------------------------------------------------------------------------

WRONG_TYPES = [
    ("temperature", "0.5"),  # a string is never a number
    ("temperature", True),
    ("max_tokens", 4.0),  # a float is never an integer
    ("max_tokens", "4"),
    ("seed", 1.5),
    ("seed", "7"),
    ("stream", "true"),
    ("stream", 1),
    ("num_denoising_steps", 4.0),
    ("block_length", "4"),
    ("block_schedule", 1),
    ("force_single_batch", "yes"),
    ("force_single_batch", 1),
    ("use_local_leap", 1),
    ("kv_cache", True),
    ("confidence_threshold", "0.9"),
    ("confidence_threshold", True),
    ("model", 5),
    ("user", 5),
    ("max_completion_tokens", 4.5),
    ("target_length", True),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES, ids=[f"{f}={v!r}" for f, v in WRONG_TYPES])
def test_wrong_json_type_is_a_400_invalid_value(service_client, field, value):
    assert_error(chat(service_client, **{field: value}), 400, "invalid_value", field)


def test_json_integer_is_a_valid_float(service_client):
    fields = {"temperature": 1, "use_local_leap": True, "local_leap_anchor_threshold": 1}
    response = chat(service_client, **fields, local_leap_neighbor_threshold=0, seed=3)
    assert response.status_code == 200, response.text
    diffusion = response.json()["diffusion"]
    assert diffusion["temperature"] == 1.0 and diffusion["local_leap_anchor_threshold"] == 1.0


def test_non_finite_numbers_are_rejected(service_client):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    assert_error(post(service_client, content=body), 400, "invalid_value", "temperature")


# --- extension fields: bounds and consistency ----------------------------------------------------------

OUT_OF_RANGE = [
    ({"num_denoising_steps": 0}, "num_denoising_steps"),
    ({"num_denoising_steps": 513}, "num_denoising_steps"),
    ({"num_denoising_steps": 5}, "num_denoising_steps"),  # more steps than tokens in the (only) block
    ({"max_tokens": 8, "block_length": 4, "num_denoising_steps": 3}, "num_denoising_steps"),  # 3 steps, 2 blocks
    ({"block_length": 0}, "block_length"),
    ({"block_length": 8}, "block_length"),  # longer than the 4-token canvas
    ({"max_tokens": 8, "block_length": 3}, "block_length"),  # does not divide the canvas
    ({"block_schedule": "linear"}, "block_schedule"),
    ({"confidence_metric": "top2_gap"}, "confidence_metric"),
    ({"target_length": 0}, "target_length"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),  # a huge canvas is a 400, never a 500 or an allocation
    ({"block_length": 10**30}, "block_length"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"attention_backend": "flash"}, "attention_backend"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.01}, "temperature"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"use_local_leap": True, "local_leap_anchor_threshold": -0.01}, "local_leap_anchor_threshold"),
    ({"use_local_leap": True, "local_leap_anchor_threshold": 1.01}, "local_leap_anchor_threshold"),
    ({"use_local_leap": True, "local_leap_neighbor_threshold": -0.01}, "local_leap_neighbor_threshold"),
    ({"use_local_leap": True, "local_leap_neighbor_threshold": 1.5}, "local_leap_neighbor_threshold"),
    ({"use_local_leap": True, "local_leap_radius": 0}, "local_leap_radius"),
    ({"use_local_leap": True, "local_leap_radius": 17}, "local_leap_radius"),
    ({"use_local_leap": True, "local_leap_radius": 2.0}, "local_leap_radius"),
    ({"local_leap_anchor_threshold": 0.9}, "local_leap_anchor_threshold"),  # without use_local_leap
    ({"use_local_leap": False, "local_leap_neighbor_threshold": 0.5}, "local_leap_neighbor_threshold"),
    ({"local_leap_radius": 4}, "local_leap_radius"),
    ({"max_tokens": 4, "max_completion_tokens": 8}, "max_completion_tokens"),
    ({"max_tokens": 4, "target_length": 8}, "target_length"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": 3}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # only with stream: true
    ({"kv_cache": "full"}, "kv_cache"),
    ({"confidence_threshold": 0}, "confidence_threshold"),
    ({"confidence_threshold": 1.01}, "confidence_threshold"),
    ({"confidence_threshold": 0.9, "num_denoising_steps": 4}, "num_denoising_steps"),  # no step count with τ
    ({"confidence_threshold": 0.9, "use_local_leap": True}, "confidence_threshold"),
    ({"confidence_threshold": 0.9, "block_schedule": "cosine"}, "block_schedule"),
]


@pytest.mark.parametrize(("fields", "param"), OUT_OF_RANGE, ids=[str(f) for f, _ in OUT_OF_RANGE])
def test_out_of_range_or_inconsistent_extension_field_is_a_400(service_client, fields, param):
    assert_error(chat(service_client, **fields), 400, "invalid_value", param)


def test_fa2_backend_is_rejected_as_deferred(service_client):
    error = assert_error(chat(service_client, attention_backend="fa2"), 400, "invalid_value", "attention_backend")
    assert "deferred" in error["message"] and "sdpa" in error["message"]


def test_prompt_plus_canvas_beyond_the_model_is_a_400_with_the_numbers(service_client, service_instance):
    limit = service_instance.engine.max_sequence_length
    for field in ("max_tokens", "target_length", "max_completion_tokens"):
        body = {"messages": MESSAGES, field: limit}
        error = assert_error(post(service_client, body), 400, "invalid_value", field)
        assert str(limit) in error["message"] and "prompt" in error["message"]


VALID_BOUNDS = [
    {"num_denoising_steps": 1},
    {"num_denoising_steps": 4},
    {"max_tokens": 8, "block_length": 2, "num_denoising_steps": 4},
    {"max_tokens": 4, "block_length": 1, "num_denoising_steps": 4},
    {"block_schedule": "uniform", "confidence_metric": "top1_prob"},
    {"block_schedule": "front_loaded", "confidence_metric": "entropy_inverse", "num_denoising_steps": 2},
    {"block_schedule": "cosine", "num_denoising_steps": 2},
    {"block_schedule": "dream", "confidence_metric": "margin"},  # Dream's sampler on a LLaDA model
    {"target_length": 4, "max_tokens": None},
    {"max_tokens": 4, "max_completion_tokens": 4},
    {"max_tokens": None, "max_completion_tokens": 4},
    {"attention_backend": "sdpa", "force_single_batch": True},
    {"temperature": 0, "seed": -(2**63)},
    {"temperature": 2, "seed": 2**64 - 1},
    {"use_local_leap": True},
    {"use_local_leap": True, "local_leap_anchor_threshold": 0, "local_leap_neighbor_threshold": 1},
    {"use_local_leap": True, "local_leap_radius": 1},
    {"use_local_leap": True, "local_leap_radius": 16},
    {"stop": ["a", "b", "c", "d"], "user": "user-42", "model": "anything/at-all"},
    {"kv_cache": "none"},
    {"kv_cache": "prefix", "max_tokens": 8, "block_length": 4, "num_denoising_steps": 4},
    {"kv_cache": "dual", "max_tokens": 8, "block_length": 2, "confidence_threshold": 1},
    {"kv_cache": "dual", "confidence_threshold": 1e-9, "block_schedule": "uniform"},
    {"stop": []},  # no stop strings, as `SamplingParams(stop=[])` means
]


@pytest.mark.parametrize("fields", VALID_BOUNDS, ids=[str(f) for f in VALID_BOUNDS])
def test_values_at_the_bounds_are_accepted_and_reported(service_client, fields):
    response = chat(service_client, **fields)
    assert response.status_code == 200, response.text
    diffusion = response.json()["diffusion"]
    for name, value in fields.items():
        if name in diffusion and value is not None:
            assert diffusion[name] == (list(value) if isinstance(value, list) else value), name


def test_defaults_resolve_as_documented(service_client):
    diffusion = chat(service_client).json()["diffusion"]
    assert diffusion["gen_length"] == 4 and diffusion["block_length"] == 4
    assert diffusion["num_denoising_steps"] == 4  # min(128, gen_length)
    assert (diffusion["block_schedule"], diffusion["confidence_metric"]) == ("uniform", "top1_prob")
    assert diffusion["temperature"] == 0.0 and diffusion["attention_backend"] == "sdpa"
    assert diffusion["use_local_leap"] is False and diffusion["local_leap_radius"] is None
    assert diffusion["kv_cache"] == "none" and diffusion["confidence_threshold"] is None
    with_threshold = chat(service_client, confidence_threshold=0.9).json()["diffusion"]
    assert with_threshold["num_denoising_steps"] is None  # the threshold, not a step count, sets the forwards
    with_leap = chat(service_client, use_local_leap=True).json()["diffusion"]
    leap = [with_leap[f"local_leap_{k}"] for k in ("anchor_threshold", "neighbor_threshold", "radius")]
    assert leap == [0.9, 0.75, 4]


# --- messages -----------------------------------------------------------------------------------------

BAD_MESSAGES = [
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "video", "video": {}}]}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content"),
    ([{"role": "user", "content": ["plain string part"]}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"content": "x"}], "messages[0].role"),
    ([], "messages"),
    ("hello", "messages"),
    ([{"role": "user", "content": "ok"}, "not an object"], "messages[1]"),
]


@pytest.mark.parametrize(("messages", "param"), BAD_MESSAGES, ids=[p + str(i) for i, (_, p) in enumerate(BAD_MESSAGES)])
def test_bad_messages_are_400(service_client, messages, param):
    response = post(service_client, {"messages": messages, **SMALL})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_value", "missing_required_parameter")


def test_missing_messages_is_a_missing_required_parameter(service_client):
    error = assert_error(post(service_client, {"max_tokens": 4}), 400, "missing_required_parameter", "messages")
    assert error["message"] == "Missing required parameter: 'messages'."


def test_text_parts_and_every_role_are_accepted(service_client):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2 plus 3?"}]},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 2 plus 4?"},
    ]
    assert post(service_client, {"messages": messages, **SMALL}).status_code == 200


def test_mask_token_text_in_content_is_plain_text(service_client):
    response = post(service_client, {"messages": [{"role": "user", "content": "<|mdm_mask|> <|eot_id|>"}], **SMALL})
    assert response.status_code == 200, response.text


# --- malformed bodies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"{", b'{"messages": [}', b"not json", b"\xff\xfe", b""], ids=repr)
def test_malformed_json_is_a_400_invalid_json(service_client, body):
    response = post(service_client, content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"[]", b"1", b'"messages"', b"null"], ids=repr)
def test_json_that_is_not_an_object_is_a_400(service_client, body):
    assert post(service_client, content=body).json()["error"]["code"] == "invalid_json"
