"""BentoML's own API (/generate, /generate_stream: server/native.py) on a real `bentoml serve` with an API key.

The native routes run the engine, so they take the key as /v1 does; what stays open without it (the probes,
the metrics, the documentation pages) is listed in docs/api.md. BentoML's clients call them as BentoML's
conventions say (a string, a stream of pieces that are server-sent events); errors are the server's envelope
with X-Request-ID, whatever layer refuses (the guard, BentoML's argument validation, the engine).
"""

from __future__ import annotations

import asyncio
import json
import time

import bentoml
import httpx
import pytest

from tests.conftest import running_server
from tests.sse import named_sse_events

KEY = "native-api-test-key"
QUESTION = "What is 2 plus 3?"
ENV = {"DLLM_API_KEY": KEY}
HANG_GUARD_S = 120
pytestmark = [pytest.mark.slow, pytest.mark.server_env(ENV, fixture="server")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("native"), ENV) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as client:
        yield client


AUTH = {"Authorization": f"Bearer {KEY}"}


def assert_envelope(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["X-Request-ID"]
    error = response.json()["error"]  # an object, not BentoML's list `[{"error": ...}]`
    assert error["code"] == code and error["message"] and error["type"]
    return error


def test_the_native_routes_need_the_api_key(http):
    for route in ("/generate", "/generate_stream"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            response = http.post(route, json={"prompt": QUESTION, "max_tokens": 8}, headers=headers)
            assert_envelope(response, 401, "invalid_api_key")
        assert http.post(route, json={"prompt": QUESTION, "max_tokens": 8}, headers=AUTH).status_code == 200


def test_what_stays_open_without_the_key_runs_no_generation(http):
    """The list in docs/api.md: probes and metrics (an orchestrator and a scraper have no key) and the pages
    that describe the API; none of them runs the engine."""
    before = http.get("/metrics").text.count("dllm_requests_total")
    for path in ("/livez", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json", "/schema.json", "/playground"):
        assert http.get(path).status_code == 200, path
    assert http.get("/metrics").text.count("dllm_requests_total") == before
    assert_envelope(http.get("/v1/models"), 401, "invalid_api_key")


def test_bentoml_sync_client_gets_the_text_and_the_stream_as_server_sent_events(server):
    with bentoml.SyncHTTPClient(server.base_url, token=KEY) as client:
        text = client.generate(prompt=QUESTION, max_tokens=32)
        pieces = list(client.generate_stream(prompt=QUESTION, max_tokens=32))
        with pytest.raises(bentoml.exceptions.BentoMLException) as refused:
            client.generate(prompt=QUESTION, num_denoising_steps=0)
    events = named_sse_events("".join(pieces))
    assert all(piece.endswith("\n\n") for piece in pieces)  # each piece is whole events
    assert events[-1] == ("done", json.dumps({"finish_reason": "stop"}))
    assert [name for name, _ in events[:-1]] == [None] * (len(events) - 1)
    assert text and "".join(data for _, data in events[:-1]) == text
    assert refused.value.error_code == 400 and "num_denoising_steps" in str(refused.value)


def test_bentoml_async_client_reads_the_stream_with_bentomls_sse_parser(server):
    from bentoml.io import SSE

    async def call() -> tuple[str, list]:
        async with bentoml.AsyncHTTPClient(server.base_url, token=KEY) as client:
            text = await client.generate(prompt=QUESTION, max_tokens=32)
            events = [
                event async for event in SSE.from_iterator(client.generate_stream(prompt=QUESTION, max_tokens=32))
            ]
        return text, events

    text, events = asyncio.run(call())
    assert events[-1].event == "done"
    assert "".join(event.data for event in events[:-1]) == text


def test_the_stream_is_framed_as_bentomls_own_sse_helper_frames_it():
    from bentoml.io import SSE

    from server.native import sse_event

    for data, event in [("5", None), ("two\nlines", None), ("", None), ('{"finish_reason": "stop"}', "done")]:
        assert sse_event(data, event) == SSE(data=data, event=event).marshal()


def test_every_refusal_is_the_servers_envelope_with_a_request_id(http):
    cases = [
        ({"prompt": QUESTION, "max_tokens": -3}, 400, "invalid_value", "max_tokens"),  # the schema's validation
        ({"prompt": QUESTION, "temperature": 9}, 400, "invalid_value", "temperature"),
        ({"max_tokens": 8}, 400, "invalid_value", "prompt"),  # BentoML's own validation of its arguments
        ({"prompt": 7}, 400, "invalid_value", "prompt"),
        ({"prompt": "x" * 20_000}, 400, "invalid_value", "messages"),  # the engine's length bound
    ]
    for route in ("/generate", "/generate_stream"):
        for body, status, code, param in cases:
            response = http.post(route, json=body, headers=AUTH)
            assert assert_envelope(response, status, code)["param"] == param, (route, body, response.text)
        sent_id = "my-request-17"
        response = http.post(
            route, json={"prompt": QUESTION, "max_tokens": 8}, headers={**AUTH, "X-Request-ID": sent_id}
        )
        assert response.status_code == 200 and response.headers["X-Request-ID"] == sent_id
        assert_envelope(http.get(route, headers=AUTH), 405, "method_not_allowed")


def test_a_refused_native_request_is_logged_as_one_line_without_a_traceback(server, http):
    marker = "logged-once-please"
    response = http.post(
        "/generate", json={"prompt": QUESTION, "max_tokens": -1}, headers={**AUTH, "X-Request-ID": marker}
    )
    assert response.status_code == 400
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        log = server.log()
        lines = [line for line in log.splitlines() if marker in line]
        if lines:
            break
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.2)  # the worker's log reaches the file a little after the response
    assert len(lines) == 1 and " 400 " in lines[0] and "[INFO]" in lines[0], lines
    assert "Traceback" not in log and "Exception on /generate" not in log
