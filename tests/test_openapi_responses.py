"""The OpenAPI document declares exactly the responses the server gives: each documented operation is driven
into every status it can answer (through the in-process service, its real middleware and a real engine), and
the set it answered must be the set the document declares, no more (FastAPI's 422 is never sent) and no less.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from schemas.openapi import ERROR_RESPONSES
from server.drain import Drain
from server.middleware import RequestGuard, ResponseStartTimeout
from server.settings import ServerSettings
from tests.step_gate import HANG_GUARD_S
from tests.test_http_engine_states import serve_small_queue  # noqa: F401 (a fixture)

CHAT = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 4}
BODIES = {"/v1/chat/completions": CHAT, "/v1/completions": {"prompt": "2 plus 3 is", "max_tokens": 4}}
GENERATION = list(BODIES)
OPERATIONS = [("get", "/v1/models"), ("get", "/v1/models/{model}")] + [("post", path) for path in GENERATION]


def declared(document: dict, method: str, path: str) -> set[int]:
    """The statuses the document declares for one operation."""
    return {int(status) for status in document["paths"][path][method]["responses"]}


def asgi_post(service_client, app, path: str, body: bytes, body_ends: bool = True) -> int:
    """POST `body` to the ASGI `app` on the service's own event loop (where the engine's requests live) and
    return the status; with `body_ends=False` the rest of the body never comes."""
    sent: list[dict] = []

    async def call() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": not body_ends}]

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()  # nothing more arrives (a disconnect never does either)
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            sent.append(message)

        length = str(len(body) if body_ends else 1000).encode()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", length)],
            "client": ("127.0.0.1", 1),
            "server": ("testserver", 80),
        }
        await asyncio.wait_for(app(scope, receive, send), HANG_GUARD_S)

    service_client.portal.call(call)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


@pytest.fixture
def answered(service_client, service_instance, configure_app, serve_small_queue) -> dict:  # noqa: F811
    """Each operation's statuses, as the server answered when driven into each."""
    import service

    client = service_client
    model = service_instance.engine.model_name
    seen: dict[tuple[str, str], set[int]] = {op: set() for op in OPERATIONS}

    def record(op: tuple[str, str], status: int) -> None:
        seen[op].add(status)

    record(("get", "/v1/models"), client.get("/v1/models").status_code)
    record(("get", "/v1/models"), client.delete("/v1/models").status_code)
    record(("get", "/v1/models/{model}"), client.get(f"/v1/models/{model}").status_code)
    record(("get", "/v1/models/{model}"), client.get("/v1/models/not-this-one").status_code)
    record(("get", "/v1/models/{model}"), client.post(f"/v1/models/{model}").status_code)
    for path, body in BODIES.items():
        op = ("post", path)
        record(op, client.post(path, json=body).status_code)
        record(op, client.post(path, json={**body, "max_tokens": 0}).status_code)
        record(op, client.get(path).status_code)
        record(op, client.post(path, content=b"hello", headers={"Content-Type": "text/plain"}).status_code)
        configure_app(max_request_bytes=16)
        record(op, client.post(path, json=body).status_code)
        configure_app()
        # The service's own guard and timeout, with short limits (its are 30 s and an hour).
        stalled = RequestGuard(service.app, Drain(grace_s=5), settings=ServerSettings(body_timeout_s=0.05))
        record(op, asgi_post(client, stalled, path, b"{", body_ends=False))
        # A first step that does not come in time: the response never started.
        _, steps = serve_small_queue(max_waiting=0)
        record(op, asgi_post(client, ResponseStartTimeout(service.app, timeout=0.05), path, json.dumps(body).encode()))
        steps.run_freely()
        # A full queue: the only slot is held, no place to wait.
        _, steps = serve_small_queue(max_waiting=0)
        with ThreadPoolExecutor(max_workers=1) as pool:
            busy = pool.submit(client.post, path, json=body)
            steps.wait_for_arrival(1)
            record(op, client.post(path, json=body).status_code)
            steps.run_freely()
            assert busy.result(timeout=HANG_GUARD_S).status_code == 200

    # No model (loading): every route is a 503.
    engine = service_instance.engine
    service_instance.engine = None
    try:
        for method, path in OPERATIONS:
            response = client.request(method.upper(), path.replace("{model}", model), json=BODIES.get(path))
            record((method, path), response.status_code)
    finally:
        service_instance.engine = engine
    return seen


def test_every_status_answered_is_declared_and_every_declared_one_answered(service_client, answered):
    document = service_client.get("/openapi.json").json()
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert documented == set(OPERATIONS)  # a new route must be driven here too
    for op in OPERATIONS:
        assert declared(document, *op) == answered[op], op


def test_with_a_key_every_v1_operation_declares_and_answers_the_401(service_client, configure_app):
    configure_app(api_key="k")
    document = service_client.get("/openapi.json").json()
    for method, path in OPERATIONS:
        response = service_client.request(method.upper(), path.replace("{model}", "x"), json=BODIES.get(path))
        assert response.status_code == 401 and 401 in declared(document, method, path), path
        assert document["paths"][path][method]["responses"]["401"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"
        }


def test_errors_are_declared_in_the_openai_envelope_and_fastapis_422_is_gone(service_client):
    document = service_client.get("/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for method, path in OPERATIONS:
        for status, response in document["paths"][path][method]["responses"].items():
            if status == "200":
                continue
            assert int(status) in ERROR_RESPONSES, (path, status)
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert set(document["components"]["schemas"]["ErrorResponse"]["properties"]) == {"error"}
