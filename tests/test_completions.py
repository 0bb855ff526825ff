"""`POST /v1/completions` (OpenAI's legacy text completions), in-process: a raw prompt with no chat template,
the chat endpoint's fields, refusals, limits, auth and stream contract. The embedded model is a chat model
and answers raw text with little or nothing, so these tests check shapes and agreement, never answers."""

from __future__ import annotations

import pytest

from tests.sse import sse_events

URL = "/v1/completions"
PROMPT = "What is 2 plus 3?"
SMALL = {"max_tokens": 8}


def complete(client, **fields):
    return client.post(URL, json={"prompt": PROMPT, **SMALL, **fields})


def assert_error(response, code: str, param: str | None, status: int = 400):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    return error


def test_text_completion_shape(service_client):
    response = complete(service_client, seed=3)
    assert response.status_code == 200, response.text
    body = response.json()
    request_id = response.headers["X-Request-ID"]
    assert body["id"] == f"cmpl-{request_id}" and body["object"] == "text_completion"
    assert body["model"] == "tiny-llada-chat" and isinstance(body["created"], int)
    [choice] = body["choices"]
    assert set(choice) == {"index", "text", "finish_reason", "logprobs"}
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["diffusion"]["gen_length"] == 8 and body["diffusion"]["seed"] == 3


def test_the_prompt_is_raw_text_without_the_chat_template(service_client, service_instance):
    tokenizer = service_instance.engine.tokenizer
    prompt_tokens = complete(service_client).json()["usage"]["prompt_tokens"]
    assert prompt_tokens == len(tokenizer.encode_prompt(PROMPT))
    assert prompt_tokens < len(tokenizer.encode_chat([{"role": "user", "content": PROMPT}]))


def test_special_token_text_in_the_prompt_stays_text(service_instance):
    tokenizer = service_instance.engine.tokenizer
    ids = tokenizer.encode_prompt("<|mdm_mask|> <|eot_id|>")
    assert tokenizer.mask_id not in ids and tokenizer.eot_id not in ids


@pytest.mark.parametrize("form", ["list of one string", "token ids", "list of one token id list"])
def test_every_prompt_form_gives_the_same_completion(service_client, service_instance, form):
    ids = service_instance.engine.tokenizer.encode_prompt(PROMPT)
    prompt = {"list of one string": [PROMPT], "token ids": ids, "list of one token id list": [ids]}[form]
    as_text = complete(service_client, seed=5).json()
    other = service_client.post(URL, json={"prompt": prompt, **SMALL, "seed": 5}).json()
    assert other["choices"] == as_text["choices"] and other["usage"] == as_text["usage"]


def test_a_chat_formatted_token_prompt_is_answered(service_client, service_instance):
    # Token ids can carry the chat template: the way to reach a chat model through this endpoint.
    ids = service_instance.engine.tokenizer.encode_chat([{"role": "user", "content": "Spell cat."}])
    text = service_client.post(URL, json={"prompt": ids, "max_tokens": 16}).json()["choices"][0]["text"]
    chat = service_client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Spell cat."}], "max_tokens": 16}
    ).json()
    assert text and text == chat["choices"][0]["message"]["content"]


BAD_PROMPTS = [
    (["one", "two"], "unsupported_parameter"),
    ([[1, 2], [3]], "unsupported_parameter"),
    ("", "invalid_value"),
    ([], "invalid_value"),
    ([[]], "invalid_value"),
    ([1, "two"], "invalid_value"),
    ([-1], "invalid_value"),
    ([10**9], "invalid_value"),
    (5, "invalid_value"),
    (None, "invalid_value"),
]


@pytest.mark.parametrize(("prompt", "code"), BAD_PROMPTS, ids=[repr(p) for p, _ in BAD_PROMPTS])
def test_bad_prompts_are_400_on_prompt(service_client, prompt, code):
    assert_error(service_client.post(URL, json={"prompt": prompt, **SMALL}), code, "prompt")


def test_a_mask_token_id_in_the_prompt_is_refused(service_client, service_instance):
    mask = service_instance.engine.tokenizer.mask_id
    error = assert_error(service_client.post(URL, json={"prompt": [5, mask], **SMALL}), "invalid_value", "prompt")
    assert "mask" in error["message"]


def test_missing_prompt_is_a_missing_required_parameter(service_client):
    assert_error(service_client.post(URL, json={"max_tokens": 4}), "missing_required_parameter", "prompt")


def test_chat_fields_are_unknown_here(service_client):
    for field, value in [("messages", []), ("response_format", {"type": "text"}), ("max_completion_tokens", 4)]:
        assert_error(complete(service_client, **{field: value}), "unknown_parameter", field)


EXTENSIONS = [
    {"num_denoising_steps": 4, "block_length": 4, "block_schedule": "cosine", "confidence_metric": "margin"},
    {"block_schedule": "dream", "temperature": 0.5, "seed": 1},
    {"kv_cache": "dual", "block_length": 4, "confidence_threshold": 0.9},
    {"use_local_leap": True, "local_leap_radius": 2, "force_single_batch": True, "attention_backend": "sdpa"},
    {"target_length": 8, "stop": ["\n"]},
]


@pytest.mark.parametrize("fields", EXTENSIONS, ids=[str(f) for f in EXTENSIONS])
def test_the_diffusion_extension_fields_work_as_in_chat(service_client, fields):
    response = complete(service_client, **fields)
    assert response.status_code == 200, response.text
    diffusion = response.json()["diffusion"]
    for name, value in fields.items():
        if name in diffusion:
            assert diffusion[name] == value, name


def test_the_chat_rules_apply(service_client, service_instance):
    assert_error(complete(service_client, num_denoising_steps=9), "invalid_value", "num_denoising_steps")
    assert_error(complete(service_client, max_tokens=8.0), "invalid_value", "max_tokens")
    assert_error(complete(service_client, stream_options={"include_usage": True}), "invalid_value", "stream_options")
    assert_error(complete(service_client, target_length=4), "invalid_value", "target_length")
    limit = service_instance.engine.max_sequence_length
    error = assert_error(complete(service_client, max_tokens=limit), "invalid_value", "max_tokens")
    assert str(limit) in error["message"]


def test_stream_sends_one_text_chunk_per_step_then_finish_usage_done(service_client):
    whole = complete(service_client, max_tokens=16, seed=2).json()
    options = {"include_usage": True}
    response = complete(service_client, max_tokens=16, seed=2, stream=True, stream_options=options)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
    *steps, finish, usage = chunks
    assert [c["diffusion"]["step"] for c in steps] == list(range(len(steps)))
    assert all(c["choices"][0]["finish_reason"] is None for c in steps)
    assert "".join(c["choices"][0]["text"] for c in steps) == whole["choices"][0]["text"]
    assert finish["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert finish["diffusion"]["num_forward_passes"] == len(steps) == whole["diffusion"]["num_forward_passes"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_limits_and_auth_are_the_chat_endpoints(service_client, configure_app):
    configure_app(max_request_bytes=64)
    assert_error(complete(service_client, user="x" * 100), "request_too_large", None, status=413)
    configure_app(api_key="k")  # and the size limit as the service started
    assert_error(complete(service_client), "invalid_api_key", None, status=401)
    ok = service_client.post(URL, json={"prompt": PROMPT, **SMALL}, headers={"Authorization": "Bearer k"})
    assert ok.status_code == 200


def test_completions_are_counted_by_the_engine(service_client, service_instance):
    before = service_instance.engine.stats.requests_total
    complete(service_client)
    assert service_instance.engine.stats.requests_total == before + 1
