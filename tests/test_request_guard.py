"""The HTTP layer's own limits, in-process and fast: settings, the request guard (drain, JSON-only bodies,
the body deadline), the drain's bookkeeping, and the connection protocol's timers on a fake transport.
tests/test_reliability.py checks the same behaviour on a real `bentoml serve`."""

from __future__ import annotations

import asyncio
import json
import resource

import pytest

from api.settings import DEFAULT_MAX_REQUEST_BYTES, ApiSettings
from server.drain import Drain
from server.middleware import RequestGuard, is_json
from server.settings import DEFAULT_MAX_CONNECTIONS, ServerSettings, default_max_connections

# --- settings -----------------------------------------------------------------------------------------


def test_settings_defaults_are_seconds_to_tens_of_seconds():
    settings = ServerSettings.from_env({})
    assert settings.keep_alive_timeout_s == 5 and settings.header_timeout_s == 10
    assert settings.body_timeout_s == 30 and settings.send_timeout_s == 60
    assert settings.shutdown_grace_s == 30 and settings.cors_origins == ()
    assert settings.max_connections == default_max_connections()


def test_settings_read_every_variable():
    environ = {
        "DLLM_KEEP_ALIVE_TIMEOUT_S": "1.5",
        "DLLM_HEADER_TIMEOUT_S": "2",
        "DLLM_BODY_TIMEOUT_S": "3",
        "DLLM_SEND_TIMEOUT_S": "4",
        "DLLM_SHUTDOWN_GRACE_S": "5",
        "DLLM_MAX_CONNECTIONS": "6",
        "DLLM_CORS_ORIGINS": "https://a.example, http://localhost:8080/",
    }
    settings = ServerSettings.from_env(environ)
    assert (settings.keep_alive_timeout_s, settings.header_timeout_s, settings.body_timeout_s) == (1.5, 2, 3)
    assert (settings.send_timeout_s, settings.shutdown_grace_s, settings.max_connections) == (4, 5, 6)
    assert settings.cors_origins == ("https://a.example", "http://localhost:8080")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DLLM_BODY_TIMEOUT_S", "0"),
        ("DLLM_BODY_TIMEOUT_S", "-1"),
        ("DLLM_HEADER_TIMEOUT_S", "soon"),
        ("DLLM_KEEP_ALIVE_TIMEOUT_S", "inf"),
        ("DLLM_SHUTDOWN_GRACE_S", "nan"),
        ("DLLM_MAX_CONNECTIONS", "0"),
        ("DLLM_MAX_CONNECTIONS", "2.5"),
        ("DLLM_CORS_ORIGINS", "example.com"),
        ("DLLM_CORS_ORIGINS", "https://a.example/path"),
        ("DLLM_MAX_REQUEST_BYTES", "-5"),
        ("DLLM_LOG_LEVEL", "LOUD"),
        ("DLLM_MAX_CONNECTIONS", "²"),  # str.isdigit says yes, int says no
        ("DLLM_MAX_CONNECTIONS", "٣"),  # int would read it as 3
        ("DLLM_MAX_REQUEST_BYTES", "²"),
        ("DLLM_KEEP_ALIVE_TIMEOUT_S", "1e-9"),  # would close every connection as it opens
        ("DLLM_SEND_TIMEOUT_S", "٣"),  # float reads it as 3.0
    ],
)
def test_a_bad_setting_is_an_error_naming_it(variable, value):
    with pytest.raises(ValueError, match=variable):
        ServerSettings.from_env({variable: value})


@pytest.mark.parametrize("value", ["٣", "²", "1_000", "3.0", "-1"])
def test_a_scheduler_integer_in_anything_but_ascii_digits_is_refused_naming_it(value):
    from engine.scheduler import SchedulerConfig

    for variable in ("DLLM_MAX_WAITING", "DLLM_MAX_PROMPT_TOKENS"):
        with pytest.raises(ValueError, match=variable):
            SchedulerConfig.from_env({variable: value})


def test_the_apps_settings_are_read_with_the_servers(monkeypatch):
    assert ServerSettings.from_env({}).api == ApiSettings(max_request_bytes=DEFAULT_MAX_REQUEST_BYTES, api_key=None)
    settings = ServerSettings.from_env({"DLLM_MAX_REQUEST_BYTES": "4096", "DLLM_API_KEY": "sekrit"})
    assert settings.api == ApiSettings(max_request_bytes=4096, api_key="sekrit")
    assert "sekrit" not in repr(settings)  # settings may be logged; the key must not be
    assert ServerSettings.from_env({"DLLM_API_KEY": ""}).api.api_key is None  # empty: no key, an open API


def test_the_app_uses_the_settings_it_was_created_with_not_the_environment(monkeypatch, fixture_engine):
    """The portable app on its own, without BentoML: create_app(settings) and an engine are all a host gives it."""
    from starlette.testclient import TestClient

    from api.app import create_app

    monkeypatch.setenv("DLLM_API_KEY", "from-the-environment")
    monkeypatch.setenv("DLLM_MAX_REQUEST_BYTES", "1")
    app = create_app(ApiSettings(max_request_bytes=64, api_key="k"))
    app.state.engine = fixture_engine
    client = TestClient(app)
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer from-the-environment"}).status_code == 401
    key = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    assert client.get("/v1/models", headers=key).status_code == 200
    too_big = client.post("/v1/chat/completions", content=b"{" + b" " * 64 + b"}", headers=key)
    assert too_big.status_code == 413 and "64 bytes" in too_big.json()["error"]["message"]
    assert client.post("/v1/chat/completions", content=b"{" + b" " * 8 + b"}", headers=key).status_code == 400
    assert "bearer" in client.get("/openapi.json").json()["components"]["securitySchemes"]
    open_app = create_app(ApiSettings())
    open_app.state.engine = fixture_engine
    assert TestClient(open_app).get("/v1/models").status_code == 200  # no key: open
    assert "securitySchemes" not in TestClient(open_app).get("/openapi.json").json()["components"]


def test_the_connection_cap_stays_below_the_descriptor_limit(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert default_max_connections() == 1024 - 256
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1_000_000, 1_000_000))
    assert default_max_connections() == DEFAULT_MAX_CONNECTIONS


def test_every_setting_is_documented_in_the_deploy_guide():
    from engine.scheduler import SchedulerConfig
    from tests.fixture_paths import REPO_ROOT

    guide = (REPO_ROOT / "docs" / "deploy.md").read_text()
    for variable in [*ServerSettings.ENV_VARS.values(), *SchedulerConfig.ENV_VARS.values()]:
        assert f"| `{variable}` |" in guide, variable


@pytest.mark.parametrize(
    ("content_type", "accepted"),
    [
        ("application/json", True),
        ("Application/JSON", True),
        ("application/json; charset=utf-8", True),
        ('application/json;charset="UTF-8"', True),
        (None, False),
        ("", False),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/json; charset=latin-1", False),
        ("application/jsonp", False),
        ("text/json", False),
    ],
)
def test_only_json_bodies_pass(content_type, accepted):
    assert is_json(content_type) is accepted


# --- the request guard, around a small ASGI app ---------------------------------------------------------


async def echo_body(scope, receive, send):
    """Reads the whole body, then answers it back."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def http_scope(
    method="POST", path="/v1/chat/completions", content_type: str | None = "application/json", body_length=None
) -> dict:
    headers = [(b"host", b"test")] + ([(b"content-type", content_type.encode())] if content_type else [])
    if body_length is not None:
        headers.append((b"content-length", str(body_length).encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b"", "state": {}}


class Exchange:
    """Feeds body chunks to the app (each after a delay, None: never) and records what it sends."""

    def __init__(self, chunks: list[tuple[float | None, bytes]]):
        self.chunks = list(chunks)
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if not self.chunks:
            await asyncio.Event().wait()  # the body is complete: nothing until the client leaves
        delay, body = self.chunks.pop(0)
        if delay is None:
            await asyncio.Event().wait()  # a stalled upload
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return {k.decode().lower(): v.decode() for k, v in start["headers"]}

    @property
    def error(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"))["error"]


def run(coroutine, timeout: float = 10):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def test_a_body_in_time_passes_through():
    guard = RequestGuard(echo_body, Drain(grace_s=5), settings=ServerSettings(body_timeout_s=1.0))
    exchange = Exchange([(0.05, b'{"a":'), (0.05, b"1}")])
    run(guard(http_scope(), exchange.receive, exchange.send))
    assert exchange.status == 200
    assert exchange.sent[-1]["body"] == b'{"a":1}'


@pytest.mark.parametrize("chunks", [[(None, b"")], [(0.0, b'{"mess'), (None, b"")], [(0.2, b"{")] * 10])
def test_a_stalled_or_slow_body_gets_a_408_that_closes_the_connection(chunks):
    guard = RequestGuard(echo_body, Drain(grace_s=5), settings=ServerSettings(body_timeout_s=0.5))
    exchange = Exchange(chunks)
    run(guard(http_scope(), exchange.receive, exchange.send))
    assert exchange.status == 408
    assert exchange.error["code"] == "request_timeout"
    assert exchange.headers["connection"] == "close" and exchange.headers["x-request-id"]


@pytest.mark.parametrize(
    ("content_type", "method", "length", "status"),
    [
        ("text/plain", "POST", 2, 415),
        (None, "POST", 2, 415),
        ("text/plain", "PUT", 2, 415),
        ("text/plain", "GET", 2, 200),
        (None, "POST", 0, 200),  # no body: the route answers (a 405 for a wrong method, a 400 for chat)
    ],
)
def test_bodies_must_be_json(content_type, method, length, status):
    guard = RequestGuard(echo_body, Drain(grace_s=5), settings=ServerSettings(body_timeout_s=1.0))
    exchange = Exchange([(0.0, b"{}" if length else b"")])
    run(guard(http_scope(method, content_type=content_type, body_length=length), exchange.receive, exchange.send))
    assert exchange.status == status
    if status == 415:
        assert (exchange.error["code"], exchange.error["param"]) == ("unsupported_media_type", "Content-Type")


def test_while_draining_new_requests_get_a_503_but_probes_are_served():
    drain = Drain(grace_s=5)
    drain.draining = True
    guard = RequestGuard(echo_body, drain, settings=ServerSettings(body_timeout_s=1.0))
    refused, probe = Exchange([(0.0, b"{}")]), Exchange([(0.0, b"")])
    run(guard(http_scope(), refused.receive, refused.send))
    run(guard(http_scope("GET", "/readyz", None), probe.receive, probe.send))
    assert refused.status == 503 and refused.error["code"] == "shutting_down"
    assert refused.headers["retry-after"] and refused.headers["connection"] == "close"
    assert probe.status == 200


def test_an_upload_still_arriving_when_the_drain_begins_gets_the_503_at_once():
    drain = Drain(grace_s=60)
    guard = RequestGuard(echo_body, drain, settings=ServerSettings(body_timeout_s=60))
    exchange = Exchange([(0.0, b'{"mess'), (None, b"")])

    async def scenario():
        request = asyncio.ensure_future(guard(http_scope(), exchange.receive, exchange.send))
        await asyncio.sleep(0.1)
        assert drain.running == 1
        drain.begin()
        await request  # well before either 60 s timeout (run's guard is 10 s)
        assert drain.running == 0

    run(scenario())
    assert exchange.status == 503 and exchange.error["code"] == "shutting_down"


# --- the drain's bookkeeping ----------------------------------------------------------------------------


def test_the_drain_waits_for_running_requests_and_no_longer():
    drain = Drain(grace_s=5)
    expired = []

    async def request(seconds: float) -> None:
        with drain.track():
            await asyncio.sleep(seconds)

    async def scenario():
        loop = asyncio.get_running_loop()
        running = [asyncio.ensure_future(request(s)) for s in (0.2, 0.4)]
        await asyncio.sleep(0.05)
        started = loop.time()
        await drain.run(on_grace_expired=lambda: expired.append(True))
        waited = loop.time() - started
        assert all(task.done() and not task.cancelled() for task in running)
        return waited

    waited = run(scenario())
    assert not expired
    assert waited < 5  # returned when the last request ended, not at the end of the grace period


def test_at_the_end_of_the_grace_period_the_engine_is_stopped_then_leftovers_are_cancelled(monkeypatch):
    import server.drain

    monkeypatch.setattr(server.drain, "WIND_DOWN_S", 0.2)
    drain = Drain(grace_s=0.3)
    order = []

    async def stuck_request() -> None:
        with drain.track():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                order.append("cancelled")
                raise

    async def scenario():
        task = asyncio.ensure_future(stuck_request())
        await asyncio.sleep(0.05)
        await drain.run(on_grace_expired=lambda: order.append("engine stopped"))
        assert task.cancelled()

    run(scenario())
    assert order == ["engine stopped", "cancelled"]


def test_a_probe_during_the_drain_does_not_end_it_early():
    drain = Drain(grace_s=5)

    async def request(seconds: float) -> None:
        with drain.track():
            await asyncio.sleep(seconds)

    async def scenario():
        long = asyncio.ensure_future(request(0.5))
        await asyncio.sleep(0.05)
        draining = asyncio.ensure_future(drain.run())
        await asyncio.sleep(0.05)
        await request(0.01)  # a probe comes and goes
        await draining
        assert long.done()

    run(scenario())


# --- the connection protocol's timers, on a fake transport ------------------------------------------------


class FakeTransport:
    """Records what is written; closing it tells the protocol, on the next loop iteration, as asyncio does."""

    def __init__(self):
        self.written = b""
        self.closed = self.aborted = False
        self.protocol = None

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self._lose(None)
        self.closed = True

    def abort(self) -> None:
        self._lose(ConnectionAbortedError())
        self.aborted = True

    def _lose(self, exc) -> None:
        if not self.is_closing():
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, exc)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 3000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.fixture
def guarded_protocol(monkeypatch):
    """uvicorn's h11 protocol with the connection guard mixed in, and settings with short timers."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    from server.connections import ConnectionGuardMixin

    class Guarded(ConnectionGuardMixin, H11Protocol):
        pass

    settings = ServerSettings(keep_alive_timeout_s=0.2, header_timeout_s=0.2, send_timeout_s=0.2, max_connections=2)
    monkeypatch.setattr(ConnectionGuardMixin, "settings", settings)
    config = uvicorn.Config(app=echo_body)
    config.load()
    state = ServerState()

    def connect(loop) -> tuple[Guarded, FakeTransport]:
        protocol = Guarded(config=config, server_state=state, app_state={}, _loop=loop)
        transport = FakeTransport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        return protocol, transport

    return connect


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(guarded_protocol):
    async def scenario():
        _, transport = guarded_protocol(asyncio.get_running_loop())
        await asyncio.sleep(0.4)
        return transport

    transport = run(scenario())
    assert transport.closed and transport.written == b""


def test_a_head_that_never_completes_gets_a_408(guarded_protocol):
    async def scenario():
        protocol, transport = guarded_protocol(asyncio.get_running_loop())
        for _ in range(10):  # a byte every 0.1 s: each byte would reset a plain idle timer
            if transport.closed:
                break
            protocol.data_received(b"G")
            await asyncio.sleep(0.1)
        return transport

    transport = run(scenario())
    assert transport.written.startswith(b"HTTP/1.1 408 ") and transport.closed


def test_a_reader_that_stops_reading_is_cut(guarded_protocol):
    async def scenario():
        protocol, transport = guarded_protocol(asyncio.get_running_loop())
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")  # in progress
        protocol.pause_writing()  # the client's window is full
        await asyncio.sleep(0.4)
        return transport

    assert run(scenario()).aborted


def test_a_reader_that_keeps_up_is_not_cut(guarded_protocol):
    async def scenario():
        protocol, transport = guarded_protocol(asyncio.get_running_loop())
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")  # in progress
        for _ in range(4):
            protocol.pause_writing()
            await asyncio.sleep(0.1)
            protocol.resume_writing()
        return transport

    assert not run(scenario()).aborted


def test_at_the_cap_the_oldest_waiting_connection_makes_room(guarded_protocol):
    async def scenario():
        loop = asyncio.get_running_loop()
        (_, oldest), (_, newer) = guarded_protocol(loop), guarded_protocol(loop)
        _, third = guarded_protocol(loop)
        return oldest, newer, third

    oldest, newer, third = run(scenario())
    assert oldest.closed and not newer.closed and not third.closed
    assert third.written == b""


def test_at_the_cap_with_every_connection_busy_only_a_probe_gets_through(guarded_protocol):
    async def scenario():
        loop = asyncio.get_running_loop()
        busy = [guarded_protocol(loop) for _ in range(2)]
        for protocol, _ in busy:
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        not_a_probe, refused = guarded_protocol(loop)
        not_a_probe.data_received(b"GET /v1/mod")  # past the cap: it waits for the request line to show a probe
        waited = refused.written
        not_a_probe.data_received(b"els HTTP/1.1\r\nHost: x\r\n\r\n")
        probe, probe_transport = guarded_protocol(loop)
        probe.data_received(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)
        return [transport.closed for _, transport in busy], waited, refused, probe_transport

    busy_closed, waited, refused, probe = run(scenario())
    assert busy_closed == [False, False] and waited == b""
    head, _, body = refused.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    assert not probe.written.startswith(b"HTTP/1.1 503 ")  # the probe went on to the app
