"""The HTTP contract in-process: response and stream shapes, X-Request-ID, API key, models, the error
envelope for overload and failures, and what /docs documents (docs/design.md, "HTTP contract")."""

from __future__ import annotations

import json
import uuid

import pytest

from engine import EngineOverloaded, EngineShutdown, GenerationResult, SamplingParams, StepEvent
from tests.sse import sse_events

URL = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
JSON = {"Content-Type": "application/json"}
EXTENSION_FIELDS = [
    "num_denoising_steps",
    "block_length",
    "block_schedule",
    "confidence_metric",
    "target_length",
    "attention_backend",
    "force_single_batch",
    "use_local_leap",
    "local_leap_anchor_threshold",
    "local_leap_neighbor_threshold",
    "local_leap_radius",
    "kv_cache",
    "confidence_threshold",
]


def is_uuid7(value: str) -> bool:
    try:
        return uuid.UUID(value).version == 7
    except ValueError:
        return False


# --- non-stream ---------------------------------------------------------------------------------------


def test_completion_shape_usage_and_resolved_parameters(service_client, service_instance):
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0.5, "seed": 11, "model": "ignored"}
    response = service_client.post(URL, json=body)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["object"] == "chat.completion"
    assert completion["model"] == service_instance.engine.model_name  # the request's `model` is ignored
    assert completion["id"] == f"chatcmpl-{response.headers['X-Request-ID']}"
    assert isinstance(completion["created"], int)
    (choice,) = completion["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = completion["usage"]
    assert usage["prompt_tokens"] > 0 and 0 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    diffusion = completion["diffusion"]
    assert (diffusion["gen_length"], diffusion["seed"], diffusion["temperature"]) == (8, 11, 0.5)
    assert 1 <= diffusion["num_forward_passes"] <= diffusion["num_denoising_steps"]


def test_omitted_seed_is_reported_and_reproduces_the_output(service_client):
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.5}
    first = service_client.post(URL, json=body).json()
    again = service_client.post(URL, json={**body, "seed": first["diffusion"]["seed"]}).json()
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_stop_string_cuts_the_text_at_its_first_occurrence(service_client):
    # The stop string comes from the served model's own answer, computed here rather than assumed: a character it
    # repeats, so that a cut at a later occurrence would show. The prompt asks for a spelled word for that reason.
    # One denoising step makes the whole answer final at once: one token at a time, the first occurrence would end
    # the request before a second one existed, and a cut at the last occurrence could not be told apart.
    body = {"messages": [{"role": "user", "content": "Spell banana."}], "max_tokens": 16, "num_denoising_steps": 1}
    text = service_client.post(URL, json=body).json()["choices"][0]["message"]["content"]
    repeated = [c for c in dict.fromkeys(text) if not c.isspace() and text.count(c) >= 2]
    assert repeated, f"the prompt should draw an answer that repeats a character; the served model said {text!r}"
    stop = repeated[0]
    expected = text[: text.index(stop)]

    completion = service_client.post(URL, json={**body, "stop": [stop]}).json()
    assert completion["choices"][0]["message"]["content"] == expected
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["diffusion"]["stop"] == [stop]
    stream = sse_events(service_client.post(URL, json={**body, "stop": stop, "stream": True}).text)
    chunks = [event for event in stream[:-1] if event["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# --- stream -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "acceleration",
    [{}, {"kv_cache": "prefix"}, {"kv_cache": "dual", "confidence_threshold": 0.5}],
    ids=["no-cache", "prefix-cache", "dual-cache-threshold"],
)
def test_stream_chunks_follow_the_contract(service_client, acceleration):
    body = {"messages": MESSAGES, "max_tokens": 16, "block_length": 8, "temperature": 0.7, "seed": 5, **acceleration}
    plain = service_client.post(URL, json=body).json()
    response = service_client.post(
        URL, json={**body, "stream": True, "stream_options": {"include_usage": True}}, headers={"X-Request-ID": "s-1"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["X-Request-ID"] == "s-1"
    events = sse_events(response.text)
    role, *steps, finish, usage, done = events
    assert done == "[DONE]"
    for chunk in events[:-1]:
        assert chunk["id"] == "chatcmpl-s-1" and chunk["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}

    # One chunk per forward pass, contiguous steps, masked_remaining never increasing.
    assert [s["diffusion"]["step"] for s in steps] == list(range(len(steps)))
    assert len(steps) == finish["diffusion"]["num_forward_passes"] == plain["diffusion"]["num_forward_passes"]
    remaining = [s["diffusion"]["masked_remaining"] for s in steps]
    assert remaining == sorted(remaining, reverse=True) and all(r >= 0 for r in remaining)
    positions = [c["position"] for s in steps for c in s["diffusion"]["committed"]]
    assert len(positions) == len(set(positions)) and all(0 <= p < 16 for p in positions)
    assert [s["diffusion"]["block"] for s in steps] == sorted(s["diffusion"]["block"] for s in steps)
    for s in steps:
        assert set(s["choices"][0]["delta"]) == {"content"} and s["choices"][0]["finish_reason"] is None
        for committed in s["diffusion"]["committed"]:
            assert set(committed) == {"position", "token_id", "text"}

    # Deltas concatenate to the non-stream content; the finish and usage chunks close the stream.
    assert "".join(s["choices"][0]["delta"]["content"] for s in steps) == plain["choices"][0]["message"]["content"]
    assert finish["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert finish["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]


@pytest.mark.parametrize("stream_options", [None, {}, {"include_usage": None}, {"include_usage": False}])
def test_stream_without_include_usage_has_no_usage_chunk(service_client, stream_options):
    body = {"messages": MESSAGES, "max_tokens": 4, "stream": True, "stream_options": stream_options}
    response = service_client.post(URL, json=body)
    assert response.status_code == 200, response.text  # null means omitted, nested fields included
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(e["usage"] is None for e in events[:-1])


def test_invalid_stream_request_gets_a_plain_400_not_a_stream(service_client):
    response = service_client.post(URL, json={"messages": MESSAGES, "stream": True, "max_tokens": 10_000})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    assert uuid.UUID(response.headers["X-Request-ID"])


# --- X-Request-ID -------------------------------------------------------------------------------------


def test_request_id_is_honoured_and_becomes_the_completion_id(service_client):
    request_id = "client-id_123:abc/XYZ~" + "x" * 100
    response = service_client.post(
        URL, json={"messages": MESSAGES, "max_tokens": 4}, headers={"X-Request-ID": request_id}
    )
    assert response.headers["X-Request-ID"] == request_id
    assert response.json()["id"] == f"chatcmpl-{request_id}"


def test_request_id_length_bounds(service_client):
    # 1 to 128 printable ASCII characters ("!" to "~"): the ends of both ranges are honoured, one past is refused.
    for request_id in ("a", "!", "~", "x" * 128, "!" + "~" * 127):
        response = service_client.get("/v1/models", headers={"X-Request-ID": request_id})
        assert response.status_code == 200 and response.headers["X-Request-ID"] == request_id
    longest = "y" * 128
    response = service_client.post(URL, json={"messages": MESSAGES, "max_tokens": 4}, headers={"X-Request-ID": longest})
    assert response.json()["id"] == f"chatcmpl-{longest}"
    for request_id in ("x" * 129, "a\x7fb", "a b"):
        response = service_client.get("/v1/models", headers={"X-Request-ID": request_id})
        assert response.status_code == 400 and response.headers["X-Request-ID"] != request_id


def test_request_line_is_logged_with_the_request_id_and_user(service_client, caplog):
    with caplog.at_level("INFO", logger="dllm_serve"):
        body = {"messages": MESSAGES, "max_tokens": 4, "user": "alice"}
        service_client.post(URL, json=body, headers={"X-Request-ID": "log-1"})
    (line,) = [r.getMessage() for r in caplog.records if "request_id=log-1" in r.getMessage()]
    assert '"POST /v1/chat/completions" 200' in line and "user='alice'" in line


def test_missing_request_id_is_a_fresh_uuid7(service_client):
    first = service_client.get("/v1/models").headers["X-Request-ID"]
    second = service_client.get("/v1/models").headers["X-Request-ID"]
    assert is_uuid7(first) and is_uuid7(second) and first != second


@pytest.mark.parametrize("bad_id", ["has space", "x" * 129, "", "tab\there", "caf\xe9", "del\x7f"], ids=repr)
def test_invalid_request_id_is_a_400_carrying_a_generated_uuid7(service_client, bad_id):
    response = service_client.post(URL, json={"messages": MESSAGES}, headers={"X-Request-ID": bad_id.encode("latin-1")})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_value", "X-Request-ID", "invalid_request_error")
    generated = response.headers["X-Request-ID"]
    assert is_uuid7(generated) and generated in error["message"]


def test_errors_echo_the_request_id(service_client):
    for response in (
        service_client.post(URL, json={"messages": MESSAGES, "top_p": 0.9}, headers={"X-Request-ID": "e-1"}),
        service_client.post(URL, content=b"{", headers={"X-Request-ID": "e-1", "Content-Type": "application/json"}),
        service_client.post(URL, content=b"{}", headers={"X-Request-ID": "e-1", "Content-Type": "text/plain"}),
        service_client.get("/v1/nothing-here", headers={"X-Request-ID": "e-1"}),
    ):
        assert response.status_code in (400, 404, 415)
        assert response.headers["X-Request-ID"] == "e-1"


# --- API key ------------------------------------------------------------------------------------------


def test_api_key_when_configured(service_client, configure_app):
    configure_app(api_key="sekrit")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "sekrit"},
        {"Authorization": "Basic sekrit"},
    ):
        response = service_client.get("/v1/models", headers={**headers, "X-Request-ID": "k-1"})
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert response.headers["X-Request-ID"] == "k-1"
    response = service_client.post(URL, json={"messages": MESSAGES, "top_p": 0.9})
    assert response.status_code == 401  # authentication comes before validation
    authorized = {"Authorization": "Bearer sekrit"}
    assert service_client.get("/v1/models", headers=authorized).status_code == 200
    ok = service_client.post(URL, json={"messages": MESSAGES, "max_tokens": 4}, headers=authorized)
    assert ok.status_code == 200
    assert service_client.get("/openapi.json").status_code == 200  # docs stay public


def test_no_api_key_configured_means_open(service_client, configure_app):
    configure_app(api_key=None)
    assert service_client.get("/v1/models", headers={"Authorization": "Bearer anything"}).status_code == 200


# --- models, unknown routes, readiness ----------------------------------------------------------------


def test_models_lists_the_loaded_model(service_client, service_instance):
    listing = service_client.get("/v1/models").json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == service_instance.engine.model_name and card["object"] == "model"
    assert isinstance(card["created"], int) and card["owned_by"]


def test_models_retrieve_the_loaded_model_by_id(service_client, service_instance):
    name = service_instance.engine.model_name
    listed = service_client.get("/v1/models").json()["data"][0]
    assert service_client.get(f"/v1/models/{name}").json() == listed
    response = service_client.get("/v1/models/GSAI-ML/LLaDA-8B-Instruct")  # hub ids contain a slash
    assert response.status_code == 404
    assert response.json()["error"] | {"message": None} == {
        "message": None, "type": "invalid_request_error", "param": "model", "code": "model_not_found"
    }  # fmt: skip
    assert f"serves '{name}'" in response.json()["error"]["message"]


@pytest.mark.parametrize("declared", [True, False])
def test_oversized_body_is_a_413_before_it_is_parsed(service_client, configure_app, declared):
    configure_app(max_request_bytes=1000)
    small = json.dumps({"messages": MESSAGES, "max_tokens": 4}).encode()
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    if declared:
        response = service_client.post(URL, content=big, headers={"Content-Type": "application/json"})
    else:  # chunked transfer: no Content-Length, so the limit is enforced while reading
        response = service_client.post(URL, content=iter([big[:600], big[600:]]), headers=JSON)
    assert response.status_code == 413
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "request_too_large", None)
    assert "1000 bytes" in error["message"] and response.headers["x-request-id"]
    assert service_client.post(URL, content=small, headers=JSON).status_code == 200  # below the limit: served


def test_request_size_limit_setting(monkeypatch):
    from api.settings import DEFAULT_MAX_REQUEST_BYTES
    from server.settings import max_request_bytes

    monkeypatch.delenv("DLLM_MAX_REQUEST_BYTES", raising=False)
    assert max_request_bytes() == DEFAULT_MAX_REQUEST_BYTES == 2 * 2**20
    monkeypatch.setenv("DLLM_MAX_REQUEST_BYTES", " 65536 ")
    assert max_request_bytes() == 65536
    for bad in ("0", "-1", "2MB", "1e6", "²", "٣"):
        monkeypatch.setenv("DLLM_MAX_REQUEST_BYTES", bad)
        with pytest.raises(ValueError, match="DLLM_MAX_REQUEST_BYTES=.*must be a positive integer"):
            max_request_bytes()


def test_unknown_v1_route_is_an_openai_shaped_404(service_client):
    response = service_client.post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("method", "path", "allowed"), [("OPTIONS", URL, "POST"), ("HEAD", "/v1/models", "GET")])
def test_wrong_method_on_a_v1_route(service_client, method, path, allowed):
    response = service_client.request(method, path, headers={"X-Request-ID": "m-405"})
    assert response.status_code == 405
    assert response.headers["Allow"] == allowed  # RFC 9110: a 405 says which methods the resource has
    assert response.headers["X-Request-ID"] == "m-405"
    if method != "HEAD":  # a HEAD response has no body
        assert response.json()["error"] | {"message": None} == {
            "message": None, "type": "invalid_request_error", "param": None, "code": "method_not_allowed"
        }  # fmt: skip
    # Every other method too, GET included (issue 14: a 405 with Allow, not OpenAI's "Invalid URL" 404).
    response = service_client.get(URL)
    assert response.status_code == 405 and response.headers["Allow"] == "POST"


def test_ready_once_the_model_is_loaded(service_client):
    assert service_client.get("/readyz").status_code == 200
    assert service_client.get("/livez").status_code == 200


# --- overload and failures (engine stubbed) -----------------------------------------------------------


def _result(params: SamplingParams) -> GenerationResult:
    return GenerationResult(
        token_ids=[1], canvas_ids=[1], text="x", finish_reason="length", num_forward_passes=1,
        prompt_tokens=3, params=params, step_commits=[[0]],
    )  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_full_queue_is_a_429_with_retry_after(service_client, service_instance, monkeypatch, stream):
    async def overloaded(*args, **kwargs):
        raise EngineOverloaded(running=8, waiting=256, max_batch_size=8, max_waiting=256)
        yield  # an async generator, like the real astream

    monkeypatch.setattr(service_instance.engine, "astream", overloaded)
    response = service_client.post(URL, json={"messages": MESSAGES, "stream": stream}, headers={"X-Request-ID": "o-1"})
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["message"]
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers["X-Request-ID"] == "o-1"


def test_error_after_the_stream_started_is_an_error_event_then_done(service_client, service_instance, monkeypatch):
    async def fails_mid_stream(*args, params=None, **kwargs):
        yield StepEvent(step=0, block=0, committed=[(0, 1)], text_delta="", masked_remaining=3, finished=False)
        raise RuntimeError("the GPU fell off the bus")

    monkeypatch.setattr(service_instance.engine, "astream", fails_mid_stream)
    response = service_client.post(URL, json={"messages": MESSAGES, "stream": True}, headers={"X-Request-ID": "m-1"})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["diffusion"]["step"] == 0
    error = events[-2]["error"]
    assert error["type"] == "server_error" and "m-1" in error["message"]
    assert "GPU" not in error["message"]  # internals stay in the server log
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize("failure", [RuntimeError("boom"), ValueError("a bug in the engine, not bad input")])
def test_unexpected_failure_is_a_500_with_the_request_id_and_a_logged_traceback(
    service_client, service_instance, monkeypatch, caplog, failure
):
    """Only the engine's InvalidParameter blames the client: any other exception before the first event,
    a ValueError included, is a 500 whose message carries the request id; the traceback is in the log."""

    async def crashes(*args, **kwargs):
        raise failure
        yield

    monkeypatch.setattr(service_instance.engine, "astream", crashes)
    with caplog.at_level("ERROR", logger="dllm_serve"):
        response = service_client.post(URL, json={"messages": MESSAGES}, headers={"X-Request-ID": "c-1"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert "c-1" in error["message"] and str(failure) not in error["message"]
    assert response.headers["X-Request-ID"] == "c-1"
    (logged,) = [r for r in caplog.records if r.exc_info and "c-1" in r.getMessage()]
    assert logged.exc_info[1] is failure


@pytest.mark.parametrize("stream", [False, True])
def test_engine_shutting_down_is_a_503(service_client, service_instance, monkeypatch, stream):
    async def stopping(*args, **kwargs):
        raise EngineShutdown("the engine is shutting down and accepts no new requests")
        yield

    monkeypatch.setattr(service_instance.engine, "astream", stopping)
    response = service_client.post(URL, json={"messages": MESSAGES, "stream": stream})
    assert response.status_code == 503
    assert response.json()["error"] | {"message": None} == {
        "message": None, "type": "server_error", "param": None, "code": "shutting_down"
    }  # fmt: skip


def test_failure_after_the_first_step_is_a_500_not_a_400(service_client, service_instance, monkeypatch):
    async def fails_after_one_step(*args, **kwargs):
        yield StepEvent(step=0, block=0, committed=[(0, 1)], text_delta="", masked_remaining=3, finished=False)
        raise ValueError("a sampler bug, not the client's fault")

    monkeypatch.setattr(service_instance.engine, "astream", fails_after_one_step)
    response = service_client.post(URL, json={"messages": MESSAGES})
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"


def test_one_failing_request_does_not_harm_the_next(service_client, service_instance, monkeypatch):
    with monkeypatch.context() as patch:

        async def crashes(*args, **kwargs):
            raise RuntimeError("boom")
            yield

        patch.setattr(service_instance.engine, "astream", crashes)
        assert service_client.post(URL, json={"messages": MESSAGES}).status_code == 500
    assert service_client.post(URL, json={"messages": MESSAGES, "max_tokens": 4}).status_code == 200


def test_stub_result_shape_matches_the_engine(service_instance):
    # Guards the stubs above: GenerationResult's fields are what the stubs build.
    assert _result(SamplingParams(gen_length=4)).completion_tokens == 1


# --- /docs --------------------------------------------------------------------------------------------


def test_docs_document_every_extension_field(service_client):
    assert service_client.get("/docs").status_code == 200
    spec = service_client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/chat/completions"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    properties = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for field in EXTENSION_FIELDS:
        assert properties[field].get("description"), field
    described = {field: properties[field]["description"] for field in EXTENSION_FIELDS}
    assert "default 0.9" in described["local_leap_anchor_threshold"]
    assert "1–16" in described["local_leap_radius"] and "default 4" in described["local_leap_radius"]
    assert "1–512" in described["num_denoising_steps"] and "min(128, gen_length)" in described["num_denoising_steps"]
    assert "deferred" in described["attention_backend"]
    for field in ("top_p", "n", "tools", "logprobs"):
        assert "ADR 005" in properties[field]["description"]
    assert "Deviation" in properties["max_tokens"]["description"]
    assert "ADR 005" in spec["info"]["description"]


def test_client_leaving_mid_upload_still_ends_the_exchange(service_client):
    """A client that closes the connection while sending the body: the app must still answer (status 499),
    or BentoML's timeout middleware keeps the request pending for traffic.timeout (an hour), which also
    blocks a graceful shutdown. Runs through the whole BentoML ASGI app, that middleware included."""
    import anyio

    incoming = [
        {"type": "http.request", "body": b'{"messages": [', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def upload_and_leave():
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": URL, "raw_path": URL.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), (b"content-length", b"1000")],
            "client": ("127.0.0.1", 50000), "server": ("testserver", 80), "state": {},
        }  # fmt: skip
        with anyio.fail_after(20):  # without a response, this would wait for the hour-long traffic timeout
            await service_client.app(scope, receive, send)

    service_client.portal.call(upload_and_leave)
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 499
    assert any(name.lower() == b"x-request-id" for name, _ in start["headers"])


def test_finished_requests_leave_no_timer_behind(service_client):
    """BentoML's traffic timeout must not keep a timer (and with it the request's context: its tracing
    span, ~7 KB) alive after the response: with the service's one-hour timeout, memory grew with every
    request for an hour."""
    import asyncio
    import gc

    def pending_timers() -> int:
        gc.collect()
        return sum(isinstance(o, asyncio.TimerHandle) and not o.cancelled() for o in gc.get_objects())

    before = pending_timers()
    for _ in range(200):
        assert service_client.get("/livez").status_code == 200
    assert service_client.post(URL, json={"messages": MESSAGES, "max_tokens": 4}).status_code == 200
    assert pending_timers() - before < 20  # 201 with the leak


def test_response_start_timeout_is_installed_in_bentomls_place_or_fails_loudly(monkeypatch):
    from bentoml._internal.server.http import traffic

    import service  # noqa: F401 - importing the service installs it
    from server.middleware import ResponseStartTimeout, install_response_start_timeout

    assert traffic.TimeoutMiddleware is ResponseStartTimeout

    class Reshaped:  # what a BentoML release that changed the internal might ship
        def __init__(self, app, *, deadline): ...

    monkeypatch.setattr(traffic, "TimeoutMiddleware", Reshaped)
    with pytest.raises(RuntimeError, match="ResponseStartTimeout cannot replace it"):
        install_response_start_timeout()
    monkeypatch.delattr(traffic, "TimeoutMiddleware")
    with pytest.raises(RuntimeError, match="ResponseStartTimeout cannot replace it"):
        install_response_start_timeout()


def test_response_start_timeout_answers_504_only_when_nothing_started():
    import anyio

    from server.middleware import ResponseStartTimeout

    async def silent(scope, receive, send):
        await anyio.sleep(60)

    async def answers(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await anyio.sleep(0.2)  # longer than the timeout: only the *start* is timed
        await send({"type": "http.response.body", "body": b"ok"})

    async def fails(scope, receive, send):
        raise RuntimeError("boom")

    async def run(app) -> list:
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.disconnect"}

        await ResponseStartTimeout(app, timeout=0.05)({"type": "http"}, receive, send)
        return sent

    timed_out = anyio.run(run, silent)
    assert timed_out[0]["status"] == 504
    assert json.loads(timed_out[1]["body"])["error"]["code"] == "timeout"
    assert [m.get("status", m.get("body")) for m in anyio.run(run, answers)] == [200, b"ok"]
    with pytest.raises(RuntimeError, match="boom"):
        anyio.run(run, fails)
