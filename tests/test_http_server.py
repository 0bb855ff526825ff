"""End to end against a real `bentoml serve` (started by the `bentoml_server` fixture): httpx, the official
OpenAI SDK, client disconnects and /metrics."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.long_request import one_block
from tests.sse import sse_events

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
METRIC_NAMES = [
    "dllm_requests_running",
    "dllm_requests_waiting",
    "dllm_requests_preparing",
    "dllm_kv_cache_bytes",
    "dllm_kv_cache_budget_bytes",
    "dllm_model_weight_bytes",
    "dllm_model_quantization_info",
    "dllm_requests_total",
    "dllm_requests_cancelled_total",
    "dllm_requests_overloaded_total",
    "dllm_forward_passes_total",
    "dllm_tokens_committed_total",
    "dllm_compiled_shapes",
    "dllm_compile_recompiles_total",
    "dllm_warm_up_seconds",
    "dllm_batch_size",
    "dllm_request_duration_seconds",
    "dllm_connections_open",
    "dllm_connections_refused_total",
    "dllm_connections_evicted_total",
    "dllm_connections_timed_out_total",
]
# Same seed, both transports: the stream must reassemble the non-stream content exactly.
SAMPLED = {"max_tokens": 24, "block_length": 8, "temperature": 0.8, "seed": 1234}


@pytest.fixture(scope="module")
def http(bentoml_server):
    with httpx.Client(base_url=bentoml_server, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(bentoml_server):
    return openai.OpenAI(base_url=f"{bentoml_server}/v1", api_key="unused", max_retries=0, timeout=120)


def metrics(http) -> dict[str, float]:
    values = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("dllm_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


# --- httpx --------------------------------------------------------------------------------------------


def test_non_stream_and_stream_agree_and_echo_the_request_id(http):
    plain = http.post("/v1/chat/completions", json={"messages": MESSAGES, **SAMPLED}, headers={"X-Request-ID": "e2e-1"})
    assert plain.status_code == 200, plain.text
    assert plain.headers["X-Request-ID"] == "e2e-1"
    completion = plain.json()
    assert completion["id"] == "chatcmpl-e2e-1"

    body = {"messages": MESSAGES, **SAMPLED, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-ID": "e2e-2"}) as response:
        assert response.status_code == 200
        assert response.headers["X-Request-ID"] == "e2e-2"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.read().decode())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["id"] == "chatcmpl-e2e-2" for c in chunks)
    steps = [c for c in chunks if "diffusion" in c and "step" in c["diffusion"]]
    assert len(steps) == completion["diffusion"]["num_forward_passes"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == completion["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == completion["usage"]


def test_bad_request_on_the_real_server(http):
    response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "top_p": 0.5})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_parameter"
    assert response.headers["X-Request-ID"]


def test_concurrent_requests_each_get_the_answer_they_get_alone(http, bentoml_server):
    """Six clients at once, half of them streaming: each gets exactly the answer (content, finish reason) the
    same request gets when it is the only one, and every slot is free afterwards. Whether the requests shared
    forwards depends on their timing here; tests/test_scheduler.py shows that they do, and that sharing leaves
    every output unchanged, deterministically."""
    prompts = [
        "What is 2 plus 3?",
        "Spell cat.",
        "What is 9 minus 4?",
        "Count from 3 to 6.",
        "Which is larger, 4 or 7?",
    ]

    def one(i: int) -> tuple[int, str, str]:
        body = {"messages": [{"role": "user", "content": prompts[i % len(prompts)]}], "max_tokens": 16}
        if i % 2:
            with httpx.stream("POST", f"{bentoml_server}/v1/chat/completions", json={**body, "stream": True}) as r:
                events = sse_events(r.read().decode())
            assert events[-1] == "[DONE]"
            chunks = [e for e in events[:-1] if e["choices"]]
            content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            return r.status_code, content, chunks[-1]["choices"][0]["finish_reason"]
        r = httpx.post(f"{bentoml_server}/v1/chat/completions", json=body, timeout=120)
        choice = r.json()["choices"][0]
        return r.status_code, choice["message"]["content"], choice["finish_reason"]

    before = metrics(http)["dllm_requests_total"]
    with ThreadPoolExecutor(max_workers=6) as pool:
        together = list(pool.map(one, range(6)))
    alone = [one(i) for i in range(6)]
    assert together == alone
    assert all(status == 200 for status, _, _ in together)
    after = metrics(http)
    assert after["dllm_requests_total"] == before + 12
    assert after["dllm_requests_running"] == after["dllm_requests_waiting"] == after["dllm_kv_cache_bytes"] == 0


# --- the official OpenAI SDK --------------------------------------------------------------------------


def test_sdk_plain_completion(sdk):
    raw = sdk.chat.completions.with_raw_response.create(
        model="whatever-the-client-says", messages=MESSAGES, max_tokens=16, extra_headers={"X-Request-ID": "sdk-1"}
    )
    assert raw.headers["X-Request-ID"] == "sdk-1"
    completion = raw.parse()
    assert completion.id == "chatcmpl-sdk-1"
    assert isinstance(completion.choices[0].message.content, str)
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert completion.model == sdk.models.list().data[0].id


def test_sdk_stream_matches_the_plain_completion(sdk):
    openai_fields = {k: v for k, v in SAMPLED.items() if k != "block_length"}
    common = {"model": "m", "messages": MESSAGES, **openai_fields, "extra_body": {"block_length": 8}}
    plain = sdk.chat.completions.create(**common)
    stream = sdk.chat.completions.create(**common, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == plain.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    step = next(c for c in chunks if c.choices and c.model_extra.get("diffusion", {}).get("step") == 0)
    assert {"step", "block", "committed", "masked_remaining"} <= set(step.model_extra["diffusion"])


def test_sdk_extension_fields_via_extra_body(sdk):
    extension = {
        "num_denoising_steps": 4,
        "block_length": 8,
        "block_schedule": "cosine",
        "confidence_metric": "entropy_inverse",
        "use_local_leap": True,
        "local_leap_radius": 2,
        "force_single_batch": True,
    }
    completion = sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16, extra_body=extension)
    diffusion = completion.model_extra["diffusion"]
    for name, value in extension.items():
        assert diffusion[name] == value
    assert diffusion["num_forward_passes"] <= 4


def test_sdk_top_p_is_a_bad_request_citing_the_adr(sdk):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="m", messages=MESSAGES, top_p=0.9)
    error = caught.value
    assert error.status_code == 400
    assert (error.code, error.param, error.type) == ("unsupported_parameter", "top_p", "invalid_request_error")
    assert "ADR 005" in error.message


# --- disconnects and /metrics -------------------------------------------------------------------------

# Many forward passes (tests/long_request.py), so a client that leaves after the first chunk leaves long before
# the request could finish: the cancelled counter tells the two apart.
LONG = one_block(256)


@pytest.mark.parametrize("kv_cache", ["none", "dual"])
def test_dropped_stream_frees_its_engine_slot(http, kv_cache):
    before = metrics(http)
    # Two blocks, so that the dual cache has one to cache; each is 128 steps, since the answer ends the request
    # with the first block (blocks of 32 left about 31 steps to notice the drop in).
    body = {"messages": MESSAGES, **LONG, "block_length": 128, "kv_cache": kv_cache, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as stream:
        assert stream.status_code == 200
        next(line for line in stream.iter_lines() if line.startswith("data: "))
    # Leaving the block closed the connection mid-stream.

    deadline = time.monotonic() + 60
    while True:
        now = metrics(http)
        freed = now["dllm_requests_running"] == now["dllm_requests_waiting"] == now["dllm_kv_cache_bytes"] == 0
        if freed and now["dllm_requests_cancelled_total"] >= before["dllm_requests_cancelled_total"] + 1:
            break
        assert time.monotonic() < deadline, f"slot not freed (or the request finished before the drop): {now}"
        time.sleep(0.2)
    # The engine is still healthy for the next client.
    after = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8})
    assert after.status_code == 200


def test_client_that_gives_up_on_a_non_stream_request_cancels_it(http, bentoml_server):
    before = metrics(http)
    url = httpx.URL(bentoml_server)
    body = json.dumps({"messages": MESSAGES, **LONG}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((url.host, url.port)) as raw:
        raw.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 60
        while metrics(http)["dllm_requests_total"] < before["dllm_requests_total"] + 1:  # it reached the engine
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.05)
    # The socket is closed: the client gave up while the request was being denoised.
    while metrics(http)["dllm_requests_cancelled_total"] < before["dllm_requests_cancelled_total"] + 1:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.2)
    assert metrics(http)["dllm_requests_running"] == 0


def test_metrics_expose_the_engine_statistics(http):
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8})
    text = http.get("/metrics").text
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    values = metrics(http)
    assert values["dllm_requests_total"] >= 1 and values["dllm_forward_passes_total"] >= 1
    assert values["dllm_batch_size_count"] == values["dllm_forward_passes_total"]
    assert "bentoml_service_request_total" in text  # BentoML's own metrics are still there


def test_metrics_label_routes_not_raw_paths(http):
    """Any path a client sends, a scan or a fuzzer's bytes, must not become a series of its own in /metrics:
    the label set would grow without bound, and control bytes in /metrics make a browser download it."""
    from prometheus_client.parser import text_string_to_metric_families

    def unmatched_404s() -> float:
        families = text_string_to_metric_families(http.get("/metrics").text)
        requests = next(f for f in families if f.name == "bentoml_service_request")  # the counter's family
        return sum(
            s.value
            for s in requests.samples
            if s.labels.get("endpoint") == "(unmatched)" and s.labels.get("http_response_code") == "404"
        )

    before = unmatched_404s()
    strays = ["/scan/%1B%01", "/wp-login.php", "/random-path-12345"]
    for path in strays:
        assert http.get(path).status_code == 404
    # A routed path with a parameter still reaches its route (the app sees the request's own path).
    assert http.get("/v1/models/tiny-llada-chat").json()["id"] == "tiny-llada-chat"
    assert http.get("/v1/models/%1Bnot-a-model").status_code == 404
    text = http.get("/metrics").text
    assert unmatched_404s() == before + len(strays)
    endpoints = {
        s.labels["endpoint"] for f in text_string_to_metric_families(text) for s in f.samples if "endpoint" in s.labels
    }
    assert "/v1/models/{model:path}" in endpoints and "/v1/models/tiny-llada-chat" not in endpoints
    assert not any(path in endpoints for path in ("/wp-login.php", "/random-path-12345"))
    assert all(character.isprintable() for character in text.replace("\n", "")), "control bytes in /metrics"
