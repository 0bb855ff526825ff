"""Reliability under hostile traffic, on a real `bentoml serve` over loopback (docs/reliability.md).

One server with short limits serves most tests: load with mixed settings (batched output equals solo
output), overload (exact 429s), disconnect storms, slow readers, idle and half-open sockets, connection and
body timeouts, oversized inputs, JSON-only bodies and CORS. Shutdown and configuration errors each start a
server of their own. Everything is bounded: the suite runs in a few minutes on 2 cores.

Latency is compared as a ratio against a baseline measured in the same test; the few absolute time bounds
are the documented limits (a grace period, a timeout) plus an allowance, or hang guards.
The soak at the end runs only when DLLM_SOAK_S (seconds) is set.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from tests.conftest import running_server, start_server
from tests.long_request import one_block
from tests.sse import sse_events

HANG_GUARD_S = 120
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
SHORT = {"messages": MESSAGES, "max_tokens": 16}
# Many forward passes: a request that is still running while the test does something else.
LONG = {"messages": MESSAGES, **one_block(256)}
# Long enough that every request of a burst arrives while the first ones still run.
MEDIUM = {"messages": MESSAGES, **one_block(128)}
LIMITS = {
    "DLLM_KEEP_ALIVE_TIMEOUT_S": "2",
    "DLLM_HEADER_TIMEOUT_S": "2",
    "DLLM_BODY_TIMEOUT_S": "3",
    "DLLM_MAX_CONNECTIONS": "64",
    "DLLM_MAX_BATCH_SIZE": "4",
    "DLLM_MAX_WAITING": "4",  # capacity: 8 requests
    "DLLM_CORS_ORIGINS": "http://playground.example",
}
CAPACITY = 8
PLAYGROUND = "http://playground.example"
pytestmark = [pytest.mark.slow, pytest.mark.server_env(LIMITS, fixture="server")]  # booted ahead (conftest)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("reliability"), LIMITS) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as client:
        yield client


def metrics(http) -> dict[str, float]:
    values = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("dllm_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_until_idle(http) -> dict[str, float]:
    """Poll /metrics until no request is running, waiting or being prepared."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        now = metrics(http)
        if now["dllm_requests_running"] == now["dllm_requests_waiting"] == now["dllm_requests_preparing"] == 0:
            return now
        assert time.monotonic() < deadline, f"the engine never went idle: {now}"
        time.sleep(0.1)


def content(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def raw_connection(server, head: bytes = b"") -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)))
    if head:
        connection.sendall(head)
    return connection


def read_until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the hang guard turns a hold into a failure)."""
    connection.settimeout(HANG_GUARD_S)
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def post_head(length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


# --- load: mixed settings, determinism, overload --------------------------------------------------------

MIXED = [
    {"max_tokens": 16, "temperature": 0.7, "seed": 1},
    {"max_tokens": 32, "block_length": 8, "temperature": 1.0, "seed": 2, "stream": True},
    {"max_tokens": 24, "block_length": 8, "block_schedule": "cosine", "seed": 3},
    {"max_tokens": 32, "block_length": 16, "kv_cache": "dual", "temperature": 0.5, "seed": 4, "stream": True},
    {"max_tokens": 16, "confidence_metric": "margin", "use_local_leap": True},
    {"max_tokens": 32, "block_length": 32, "confidence_threshold": 0.8, "kv_cache": "prefix", "seed": 5},
    {"max_tokens": 8, "temperature": 1.0, "seed": 6, "stream": True, "stream_options": {"include_usage": True}},
    {"max_tokens": 48, "block_length": 16, "num_denoising_steps": 24, "temperature": 0.9, "seed": 8},
]


def answer(http, fields: dict) -> str:
    body = {"messages": [{"role": "user", "content": f"Count to {len(fields)}."}], **fields}
    if not fields.get("stream"):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return content(response)
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = sse_events(response.read().decode())
    assert events[-1] == "[DONE]"
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"])


def test_mixed_concurrent_load_gives_the_same_answers_as_one_at_a_time(http):
    alone = [answer(http, fields) for fields in MIXED]
    with ThreadPoolExecutor(len(MIXED)) as pool:
        for _ in range(2):
            assert list(pool.map(lambda fields: answer(http, fields), MIXED)) == alone
    wait_until_idle(http)


def test_overload_is_refused_with_exactly_the_429s_past_the_capacity(server, http):
    before = metrics(http)
    extra = 5
    barrier = threading.Barrier(CAPACITY + extra)

    def open_stream(client: httpx.Client) -> httpx.Response:
        barrier.wait(HANG_GUARD_S)
        request = client.build_request("POST", "/v1/chat/completions", json={**MEDIUM, "stream": True})
        return client.send(request, stream=True)  # returns at the status: 200 means admitted

    clients = [httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) for _ in range(CAPACITY + extra)]
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            responses = list(pool.map(open_stream, clients))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] * CAPACITY + [429] * extra
        refused = [r for r in responses if r.status_code == 429]
        for response in refused:
            response.read()
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
            assert int(response.headers["Retry-After"]) >= 1
    finally:
        for response in responses:
            response.close()  # the admitted streams are dropped: their requests are cancelled
        for client in clients:
            client.close()
    after = wait_until_idle(http)
    assert after["dllm_requests_overloaded_total"] - before["dllm_requests_overloaded_total"] == extra
    assert http.post("/v1/chat/completions", json=SHORT).status_code == 200


# --- clients that leave or read slowly ------------------------------------------------------------------


def test_a_storm_of_disconnects_frees_every_slot(server, http):
    before = metrics(http)
    expected = content(http.post("/v1/chat/completions", json=SHORT))
    clients = 3 * CAPACITY

    def leave_after_the_first_chunk(_) -> int:
        with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as client:
            with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response:
                status = response.status_code
                if status == 200:
                    next(line for line in response.iter_lines() if line.startswith("data: "))
        return status

    statuses = []
    with ThreadPoolExecutor(CAPACITY) as pool:
        for _ in range(clients // CAPACITY):  # waves of the capacity; each wave's slots must all come back
            statuses += pool.map(leave_after_the_first_chunk, range(CAPACITY))
            wait_until_idle(http)
    assert statuses == [200] * clients
    assert metrics(http)["dllm_requests_cancelled_total"] - before["dllm_requests_cancelled_total"] == clients
    assert content(http.post("/v1/chat/completions", json=SHORT)) == expected  # and the engine is intact


def test_an_abandoned_native_generate_is_cancelled(server, http):
    """Issue 31: clients of /generate that gave up after 0.5 s left their requests running to the end. A client
    that leaves now cancels its request, as on /v1 and /generate_stream."""
    before = metrics(http)
    leaving = 4
    body = {"prompt": "Count to ten.", **one_block(256), "seed": 3}

    def give_up_after_half_a_second(_) -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/generate", json=body, timeout=httpx.Timeout(HANG_GUARD_S, read=0.5))

    with ThreadPoolExecutor(leaving) as pool:
        list(pool.map(give_up_after_half_a_second, range(leaving)))
    wait_until_idle(http)
    assert metrics(http)["dllm_requests_cancelled_total"] - before["dllm_requests_cancelled_total"] == leaving


def test_slow_readers_get_every_chunk_and_do_not_hold_up_others(server, http):
    body = {**SHORT, "max_tokens": 32, "temperature": 0.8, "seed": 11}
    expected = content(http.post("/v1/chat/completions", json=body))

    def read_slowly(_) -> list:
        with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as client:
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                lines = []
                for line in response.iter_lines():
                    lines.append(line)
                    time.sleep(0.02)
        return sse_events("\n".join(lines) + "\n")

    with ThreadPoolExecutor(3) as pool:
        slow = pool.map(read_slowly, range(3))
        assert content(http.post("/v1/chat/completions", json=body)) == expected  # served meanwhile
        for events in slow:
            assert events[-1] == "[DONE]"
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"]) == (
                expected
            )


# --- connections: idle, half-open, too many, timeouts -----------------------------------------------------


def worker_resources(server) -> tuple[int, int]:
    worker = psutil.Process(server.worker_pid())
    return worker.num_fds(), worker.memory_info().rss


def test_a_flood_of_idle_and_half_open_sockets_leaves_the_probes_answering(server, http):
    http.get("/readyz")  # the client's own keep-alive connection exists before the baseline
    fds_before, rss_before = worker_resources(server)
    before = metrics(http)
    sockets = []
    try:
        for i in range(400):  # about six times the cap: half idle, half with half a request head
            sockets.append(raw_connection(server, b"" if i % 2 else b"GET /readyz HTTP/1.1\r\nHost: te"))
            if i % 50 == 49:
                with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as probe:  # a new connection
                    assert probe.get("/readyz").status_code == 200
        during = metrics(http)
        assert during["dllm_connections_open"] <= int(LIMITS["DLLM_MAX_CONNECTIONS"])
        assert during["dllm_connections_evicted_total"] - before["dllm_connections_evicted_total"] >= 400 - 64
    finally:
        for connection in sockets:
            connection.close()
    # The survivors are closed by the idle and header timeouts; the worker's descriptors and memory return.
    deadline = time.monotonic() + HANG_GUARD_S
    while (fds := worker_resources(server)[0]) > fds_before:
        assert time.monotonic() < deadline, f"{fds} descriptors open, {fds_before} before the flood"
        time.sleep(0.2)
    rss_after = worker_resources(server)[1]
    assert rss_after / rss_before < 1.05, (rss_before, rss_after)
    assert metrics(http)["dllm_connections_open"] <= before["dllm_connections_open"]


def test_a_connection_that_says_nothing_is_closed_after_the_idle_timeout(server):
    connection = raw_connection(server)
    assert read_until_closed(connection) == b""


def test_a_head_that_never_completes_gets_a_408(server):
    connection = raw_connection(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: te")
    assert read_until_closed(connection).startswith(b"HTTP/1.1 408 ")


def test_a_head_trickled_byte_by_byte_is_cut_at_the_header_timeout(server):
    connection = raw_connection(server)
    connection.settimeout(0.2)
    head = b"GET /readyz HTTP/1.1\r\nHost: test\r\nX-Padding: " + b"a" * 10_000
    for byte in head:  # a byte every 0.2 s resets any timer that restarts on data
        try:
            connection.sendall(bytes([byte]))
            if reply := connection.recv(100):
                assert reply.startswith(b"HTTP/1.1 408 ")
                return
        except TimeoutError:
            continue
        except ConnectionError:
            return  # closed while we were sending: cut as well
    pytest.fail("a trickled head was never cut")


def test_a_stalled_body_gets_a_408_in_the_openai_envelope(server):
    connection = raw_connection(server, post_head(100) + b'{"messages"')
    head, _, body = read_until_closed(connection).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_slow_body_that_arrives_in_time_is_served(server):
    body = json.dumps(SHORT).encode()
    connection = raw_connection(server, post_head(len(body)))
    for i in range(0, len(body), len(body) // 4 + 1):  # four pieces over about a second (the timeout is 3 s)
        connection.sendall(body[i : i + len(body) // 4 + 1])
        time.sleep(0.25)
    connection.settimeout(HANG_GUARD_S)
    assert connection.recv(100).startswith(b"HTTP/1.1 200 ")
    connection.close()


def test_with_every_connection_busy_a_new_one_gets_a_503(server):
    cap = int(LIMITS["DLLM_MAX_CONNECTIONS"])
    busy = []
    try:
        while len(busy) < cap:  # each is inside a request: its body never comes (cut after 3 s)
            busy.append(raw_connection(server, post_head(100)))
        # Until the server has read a connection's head it is waiting for a request, and the next connection
        # would take its place instead of being refused.
        time.sleep(0.5)
        # Past the cap a connection waits for its request line (a probe would be served: the next test).
        newcomer = raw_connection(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n")
        head, _, body = read_until_closed(newcomer).partition(b"\r\n\r\n")
    finally:
        for connection in busy:
            connection.close()
    assert head.startswith(b"HTTP/1.1 503 ")
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_connections" and b"Retry-After" in head


def test_with_every_connection_busy_the_probes_still_get_through(server):
    """Issue 31: at the cap, /livez and /readyz answered 503, and an orchestrator would restart a healthy pod.
    A few connections past the cap are kept for the probes and /metrics; anything else there gets the 503."""
    cap = int(LIMITS["DLLM_MAX_CONNECTIONS"])
    busy = []
    try:
        while len(busy) < cap:
            busy.append(raw_connection(server, post_head(100)))
        time.sleep(0.5)
        for path in ("/livez", "/readyz", "/metrics"):
            probe = raw_connection(server, f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
            assert read_until_closed(probe).startswith(b"HTTP/1.1 200 "), path
        other = raw_connection(server, b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n")
        head, _, body = read_until_closed(other).partition(b"\r\n\r\n")
    finally:
        for connection in busy:
            connection.close()
    assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body)["error"]["code"] == "too_many_connections"


def test_encoded_bodies_odd_methods_and_paths_get_the_envelope(server, http):
    """Issue 31's loose ends: a gzip or br body was read as JSON (a 400, or a 200 for br); TRACE and lowercase
    methods got a 405 without a code; `//v1/models` got BentoML's plain-text 404."""
    import gzip

    for encoding, body in (("gzip", gzip.compress(json.dumps(SHORT).encode())), ("br", json.dumps(SHORT).encode())):
        response = http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 415 and response.json()["error"]["param"] == "Content-Encoding", encoding
    for method in ("TRACE", "post"):
        response = http.request(method, "/v1/models")
        assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed", method
    for path in ("//v1/models", "/nothing/here"):
        response = http.get(path)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", path
        assert response.headers["X-Request-ID"]


# --- inputs -----------------------------------------------------------------------------------------------


def test_oversized_prompts_do_not_slow_down_a_small_request(server, http):
    """Issue 15's case: ten ~2 MB prompts, far too long for the model, arrive at once with a small request.
    They are refused by their length before tokenizing, so the small request is served about as fast as
    alone (before, each took ~2.5 s on the one preparation thread, and the small one waited for all ten)."""
    oversized = json.dumps({"messages": [{"role": "user", "content": "a " * 1_000_000}]}).encode()
    clients = [httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) for _ in range(10)]

    def small_latency() -> float:
        started = time.perf_counter()
        assert http.post("/v1/chat/completions", json=SHORT).status_code == 200
        return time.perf_counter() - started

    def send_oversized(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/chat/completions", content=oversized, headers={"Content-Type": "application/json"})

    try:
        small_latency()  # warm-up
        alone, beside_burst, refusals = [], [], []
        with ThreadPoolExecutor(len(clients)) as pool:
            for _ in range(5):
                alone.append(small_latency())
                burst = [pool.submit(send_oversized, client) for client in clients]
                time.sleep(0.2)  # the burst is on its way in: the small request comes "meanwhile"
                beside_burst.append(small_latency())
                refusals += [future.result() for future in burst]
    finally:
        for client in clients:
            client.close()
    assert {r.status_code for r in refusals} == {400}
    assert {r.json()["error"]["param"] for r in refusals} == {"messages"}
    ratio = statistics.median(beside_burst) / statistics.median(alone)
    assert ratio < 5, (alone, beside_burst)


def test_thousands_of_empty_messages_are_refused_before_tokenizing_and_delay_nobody(server, http):
    """Issue 31: 20,000 empty messages are a 580 KB body whose content is empty, so a bound counting content alone
    let them through to seconds of tokenizing before their 400, and a small request waited behind them. The
    chat template's own tokens per message rule them out at once."""
    empty = json.dumps({"messages": [{"role": "user", "content": ""}] * 20_000}).encode()
    clients = [httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) for _ in range(4)]

    def small_latency() -> float:
        started = time.perf_counter()
        assert http.post("/v1/chat/completions", json=SHORT).status_code == 200
        return time.perf_counter() - started

    def send_empty(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/chat/completions", content=empty, headers={"Content-Type": "application/json"})

    try:
        small_latency()  # warm-up
        alone, beside, refusals = [], [], []
        with ThreadPoolExecutor(len(clients)) as pool:
            for _ in range(3):
                alone.append(small_latency())
                burst = [pool.submit(send_empty, client) for client in clients]
                time.sleep(0.2)
                beside.append(small_latency())
                refusals += [future.result() for future in burst]
    finally:
        for client in clients:
            client.close()
    assert {r.status_code for r in refusals} == {400}
    assert all("20000 messages" in r.json()["error"]["message"] for r in refusals)
    ratio = statistics.median(beside) / statistics.median(alone)
    assert ratio < 5, (alone, beside)


def test_bentomls_routes_have_the_body_limits_of_v1(server):
    """Issue 31: /generate read a 300 MB body in full. The size limit (413) and the body deadline (408) hold
    on BentoML's own routes too, in the server's envelope."""
    limit = 2 * 2**20  # DLLM_MAX_REQUEST_BYTES's default
    big = b'{"prompt": "' + b"a" * (limit + 10) + b'"}'
    for route in ("/generate", "/generate_stream"):
        by_length = httpx.post(f"{server.base_url}{route}", content=big, headers={"Content-Type": "application/json"})
        assert by_length.status_code == 413 and by_length.json()["error"]["code"] == "request_too_large"

        def chunks():
            for i in range(0, len(big), 65536):
                yield big[i : i + 65536]

        chunked = httpx.post(
            f"{server.base_url}{route}", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert chunked.headers["X-Request-ID"]
    head = post_head(100).replace(b"/v1/chat/completions", b"/generate")
    reply_head, _, body = read_until_closed(raw_connection(server, head + b'{"prompt"')).partition(b"\r\n\r\n")
    assert reply_head.startswith(b"HTTP/1.1 408 ") and json.loads(body)["error"]["code"] == "request_timeout"


def test_only_json_bodies_are_accepted(http):
    body = json.dumps(SHORT)
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}, {}):
        response = http.post("/v1/chat/completions", content=body, headers=headers)
        assert response.status_code == 415, headers
        assert response.json()["error"]["code"] == "unsupported_media_type"
        assert response.headers["X-Request-ID"]
    ok = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_cors_lets_the_configured_origin_call_the_api(http):
    preflight = http.options(
        "/v1/chat/completions",
        headers={
            "Origin": PLAYGROUND,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == PLAYGROUND
    assert {"authorization", "content-type"} <= set(
        preflight.headers["Access-Control-Allow-Headers"].lower().split(", ")
    )
    response = http.post("/v1/chat/completions", json=SHORT, headers={"Origin": PLAYGROUND})
    assert response.headers["Access-Control-Allow-Origin"] == PLAYGROUND
    assert "x-request-id" in response.headers["Access-Control-Expose-Headers"].lower()
    other = http.post("/v1/chat/completions", json=SHORT, headers={"Origin": "http://elsewhere.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_cors_is_off_unless_configured(bentoml_server):
    response = httpx.post(
        f"{bentoml_server}/v1/chat/completions", json=SHORT, headers={"Origin": PLAYGROUND}, timeout=HANG_GUARD_S
    )
    assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers


# --- shutdown -------------------------------------------------------------------------------------------


def wait_for_exit(process, timeout: float) -> float:
    started = time.monotonic()
    process.wait(timeout=timeout)
    return time.monotonic() - started


@pytest.mark.server_env({"DLLM_SHUTDOWN_GRACE_S": "30"})
def test_sigterm_drains_running_streams_refuses_new_work_and_exits(tmp_path):
    grace = 30
    with running_server(tmp_path, {"DLLM_SHUTDOWN_GRACE_S": str(grace)}) as server:
        client = httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S)
        # Long enough to outlast the checks below on a fast CPU: at 64 steps both streams could finish before
        # the refused request was sent, and the drain, with nothing left to wait for, closed the listener.
        body = {**SHORT, **one_block(256), "temperature": 0.8, "seed": 5}
        expected = content(client.post("/v1/chat/completions", json=body))
        streams = [
            client.send(
                client.build_request("POST", "/v1/chat/completions", json={**body, "stream": True}), stream=True
            )
            for _ in range(2)
        ]
        assert [s.status_code for s in streams] == [200, 200]
        stalled = raw_connection(server, post_head(100) + b'{"mess')
        time.sleep(0.3)

        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + HANG_GUARD_S
        while httpx.get(f"{server.base_url}/readyz", timeout=HANG_GUARD_S).status_code != 503:
            assert time.monotonic() < deadline, "readiness never turned false"
        refused = httpx.post(f"{server.base_url}/v1/chat/completions", json=SHORT, timeout=HANG_GUARD_S)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["Retry-After"]) >= 1
        assert read_until_closed(stalled).startswith(b"HTTP/1.1 503 ")  # an upload still arriving is cut

        for stream in streams:  # the running streams finish, whole
            events = sse_events(stream.read().decode())
            assert events[-1] == "[DONE]"
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"]) == (
                expected
            )
        assert wait_for_exit(server.process, timeout=grace) < grace
        assert server.process.returncode == 0, server.log()[-3000:]
        assert "draining" in server.log()


@pytest.mark.server_env({"DLLM_SHUTDOWN_GRACE_S": "1"})
def test_at_the_end_of_the_grace_period_what_still_runs_is_ended_cleanly(tmp_path):
    grace = 1
    with running_server(tmp_path, {"DLLM_SHUTDOWN_GRACE_S": str(grace)}) as server:
        client = httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S)
        endless = {"messages": MESSAGES, **one_block(448)}  # seconds of work on any CPU
        stream = client.send(
            client.build_request("POST", "/v1/chat/completions", json={**endless, "stream": True}), stream=True
        )
        assert stream.status_code == 200
        with ThreadPoolExecutor(1) as pool:
            plain = pool.submit(
                httpx.post, f"{server.base_url}/v1/chat/completions", json=endless, timeout=HANG_GUARD_S
            )
            deadline = time.monotonic() + HANG_GUARD_S
            while metrics(client)["dllm_requests_running"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            server.process.send_signal(signal.SIGTERM)
            events = sse_events(stream.read().decode())
            plain_response = plain.result()
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
        assert plain_response.status_code == 503 and plain_response.json()["error"]["code"] == "shutting_down"
        # The grace period, the wind-down (3 s) and uvicorn's own shutdown, with room to spare.
        assert wait_for_exit(server.process, timeout=grace + 30) < grace + 30


# --- configuration --------------------------------------------------------------------------------------


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        pytest.param(variable, value, marks=pytest.mark.server_env({variable: value}))
        for variable, value in [
            ("DLLM_MAX_BATCH_SIZE", "0"),
            ("DLLM_HEADER_TIMEOUT_S", "-1"),
            ("DLLM_MODEL", "/nonexistent/checkpoint"),
            ("DLLM_QUANTIZE", "int3"),
            ("DLLM_QUANTIZE", "fp8"),  # on a CPU
            ("DLLM_MAX_CONNECTIONS", "²"),  # str.isdigit says yes, int says no
            ("DLLM_MAX_WAITING", "٣"),  # int reads it as 3
            ("DLLM_KEEP_ALIVE_TIMEOUT_S", "1e-9"),
        ]
    ]
    + [
        pytest.param(
            "DLLM_DEVICE",
            "cuda",
            marks=[
                pytest.mark.server_env({"DLLM_DEVICE": "cuda"}),
                pytest.mark.skipif(_has_cuda(), reason="checks a machine without a GPU"),
            ],
        )
    ],
)
def test_an_invalid_setting_stops_bentoml_serve_with_its_message(tmp_path, variable, value):
    assert_refused_to_start(tmp_path, variable, value)


def test_a_model_directory_without_weights_stops_bentoml_serve(tmp_path):
    """Issue 31: a checkpoint directory with its config but no weights restarted the worker forever."""
    import shutil

    from tests.fixture_paths import EMBEDDED_MODEL_DIR

    model = tmp_path / "no-weights"
    model.mkdir()
    for file in EMBEDDED_MODEL_DIR.iterdir():
        if not file.name.endswith(".safetensors"):
            shutil.copy(file, model / file.name)
    assert_refused_to_start(tmp_path, "DLLM_MODEL", str(model))


def assert_refused_to_start(tmp_path, variable: str, value: str) -> None:
    process, _, log_path = start_server(tmp_path, {variable: value})
    try:
        process.wait(timeout=HANG_GUARD_S)  # no restart loop: the command ends
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0
    output = log_path.read_text(errors="replace")
    assert "invalid configuration: " in output and variable in output and value in output
    assert "Traceback" not in output  # the message, not BentoML's stack


# --- soak (opt-in) ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not os.environ.get("DLLM_SOAK_S"), reason="the soak runs only with DLLM_SOAK_S=<seconds>")
def test_soak(server, http):
    """Mixed good, bad, abandoned and idle traffic for DLLM_SOAK_S seconds: never a 5xx, memory flat."""
    duration = float(os.environ["DLLM_SOAK_S"])
    oversized = {"messages": [{"role": "user", "content": "a " * 500_000}]}
    failures: list[str] = []
    stop = threading.Event()

    def traffic(kind: int) -> None:
        with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD_S) as client:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    if kind == 0:
                        status = client.post("/v1/chat/completions", json={**SHORT, "seed": i}).status_code
                    elif kind == 1:
                        with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
                            status = r.status_code
                            next(r.iter_lines(), None)  # then leave
                    elif kind == 2:
                        status = client.post("/v1/chat/completions", json=oversized).status_code
                    elif kind == 3:
                        status = client.post("/v1/chat/completions", json={**SHORT, "top_p": 0.5}).status_code
                    else:
                        raw_connection(server, b"GET /readyz HTTP/1.1\r\n").close()
                        status = client.get("/readyz").status_code
                except httpx.HTTPError as error:
                    failures.append(f"kind {kind}: {error!r}")
                    continue
                if status >= 500:
                    failures.append(f"kind {kind}: {status}")

    warm_up = min(30.0, duration / 4)
    with ThreadPoolExecutor(6) as pool:
        running = [pool.submit(traffic, kind % 5) for kind in range(6)]
        time.sleep(warm_up)
        _, rss_warm = worker_resources(server)
        time.sleep(duration - warm_up)
        stop.set()
        for future in running:
            future.result()
    wait_until_idle(http)
    _, rss_end = worker_resources(server)
    assert not failures, failures[:20]
    assert rss_end / rss_warm < 1.10, (rss_warm, rss_end)
