"""Connection limits below the ASGI app: idle and header timeouts, a stalled-reader timeout, a connection cap.

BentoML runs uvicorn with settings of its own choosing (`_bentoml_impl/worker/service.py` builds the
`uvicorn.Config`), and none of uvicorn's limits covers a connection before its request reaches the app:
uvicorn arms its keep-alive timer only after a response, so a socket that connects and sends nothing, or
half a request head, is held forever, and nothing caps how many are open. An ASGI middleware cannot help:
the app is called only once the headers are complete. So the service swaps uvicorn's HTTP protocol for
`GuardedProtocol` (`install_connection_guard`), the same protocol with these rules:

- **idle**: a connection with no request in progress and no byte of the next one is closed after
  `keep_alive_timeout_s`, from the moment it opened or its last response ended (uvicorn's own keep-alive
  timer, armed at connect too);
- **headers**: from the first byte of a request, its head must be complete within `header_timeout_s`,
  or the connection gets a 408 and is closed (however slowly the bytes trickle in);
- **stalled reader**: while a response cannot be written because the client does not read, the
  connection is aborted after `send_timeout_s` without progress (the app sees a disconnect);
- **cap**: past `max_connections` open connections, the oldest one waiting for a request (idle or with
  half a head) is closed to make room; if every connection is busy with a request, the new one gets a
  503 `too_many_connections` and is closed, unless it is a probe: `PROBE_ROOM` connections past the cap
  wait for their request line, and one for /livez, /readyz, /healthz or /metrics is served (an
  orchestrator must not restart a pod that is merely busy). Probes keep working under a flood of idle
  sockets too.
The body of a request, once its head is in, is the app's to time (api/streaming.py, `read_body`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from typing import Any

from schemas.errors import APIError
from server.settings import ServerSettings

logger = logging.getLogger(f"dllm_serve.{__name__}")

# After refusing a connection, how long to keep reading (and discarding) what the client sends: closing a
# socket with unread data resets it, and the reset can destroy the 503 before the client reads it.
REFUSAL_LINGER_S = 1.0
# Connections past the cap kept for the probes (and /metrics) while every other connection is busy.
PROBE_ROOM = 8
# A request line longer than this on a probe's connection is not a probe's.
PROBE_LINE_BYTES = 256
# At most one "connection cap reached" warning per this many seconds (a flood would repeat it per socket).
WARNING_INTERVAL_S = 10.0


class ConnectionStats:
    """Counters for /metrics. Written on the event loop only; read from any thread (ints are atomic)."""

    METRICS = {
        "dllm_connections_open": ("gauge", "HTTP connections open in this worker."),
        "dllm_connections_refused_total": ("counter", "Connections refused with a 503 at DLLM_MAX_CONNECTIONS."),
        "dllm_connections_evicted_total": (
            "counter",
            "Connections waiting for a request closed to make room at DLLM_MAX_CONNECTIONS.",
        ),
        "dllm_connections_timed_out_total": (
            "counter",
            "Connections closed by the idle, header or send timeout.",
        ),
    }

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0

    def prometheus_text(self) -> str:
        values = {
            "dllm_connections_open": self.open,
            "dllm_connections_refused_total": self.refused,
            "dllm_connections_evicted_total": self.evicted,
            "dllm_connections_timed_out_total": self.timed_out,
        }
        lines: list[str] = []
        for name, (kind, help_text) in self.METRICS.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {values[name]}"]
        return "\n".join(lines) + "\n"


connection_stats = ConnectionStats()


def _is_probe(request_line: bytes) -> bool:
    """Whether a request line asks for a probe or /metrics (GET or HEAD, any query)."""
    from server.middleware import PROBE_PATHS  # not at the top: server.middleware imports the app

    parts = request_line.split(b" ")
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
        return False
    return parts[1].split(b"?")[0].decode("latin-1") in PROBE_PATHS


def _raw_response(status: int, reason: str, error: APIError | None) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written straight to the socket."""
    body = json.dumps(error.body()).encode() if error is not None else b""
    headers = [f"HTTP/1.1 {status} {reason}", "Connection: close", f"Content-Length: {len(body)}"]
    if error is not None:
        headers.append("Content-Type: application/json")
        headers += [f"{name}: {value}" for name, value in error.headers.items()]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


class _Waiting:
    """The connections of one server waiting for a request, oldest first (a dict keeps insertion order)."""

    def __init__(self) -> None:
        self.connections: dict[Any, None] = {}
        self.last_warning = 0.0


class ConnectionGuardMixin:
    """The rules in the module docstring, mixed into uvicorn's HTTP protocol class (h11 or httptools).

    It relies on what both of uvicorn's protocols have: `connections` (the server's open connections),
    `cycle` (the current request, `response_complete` once answered), `transport`, `loop`,
    `timeout_keep_alive` / `timeout_keep_alive_task` / `timeout_keep_alive_handler`, and the asyncio
    protocol callbacks. `install_connection_guard` checks those names before swapping the class in.
    """

    settings: ServerSettings = ServerSettings()
    _waiting_by_server: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.settings.keep_alive_timeout_s
        self._header_timer: Any = None
        self._send_timer: Any = None
        self._refused = False
        self._probe_only: bytes | None = None  # past the cap: the bytes held until the request line shows a probe
        self._waiting = self._waiting_by_server.setdefault(self.server_state, _Waiting())

    # --- asyncio protocol callbacks ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        connection_stats.open += 1
        if len(self.connections) > self.settings.max_connections and not self._make_room():
            if len(self.connections) > self.settings.max_connections + PROBE_ROOM:
                self._refuse()
                return
            self._probe_only = b""
        self._wait_for_request()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the linger ends
        if self._probe_only is not None:
            data = self._probe_only + data
            line, found, _ = data.partition(b"\r\n")
            if not found and len(data) <= PROBE_LINE_BYTES:
                self._probe_only = data  # the request line is not complete yet
                if self._header_timer is None:
                    self._header_timer = self.loop.call_later(self.settings.header_timeout_s, self._header_timeout)
                return
            self._probe_only = None
            if not _is_probe(line):
                self._refuse()
                return
        if self._header_timer is None and self._idle():
            # The first byte of a request: its head must now arrive in time, however slowly it trickles.
            self._header_timer = self.loop.call_later(self.settings.header_timeout_s, self._header_timeout)
        super().data_received(data)
        if not self._idle():
            self._request_started()

    def eof_received(self) -> Any:
        if self._refused:
            self.transport.close()
            return None
        return super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._idle() and not self.transport.is_closing():
            self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        connection_stats.open -= 1
        self._waiting.connections.pop(self, None)
        self._cancel_timers()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.settings.send_timeout_s, self._send_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    # --- states -----------------------------------------------------------------------------------

    def _idle(self) -> bool:
        """No request in progress (none yet, or the last one answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _wait_for_request(self) -> None:
        self._waiting.connections.pop(self, None)
        self._waiting.connections[self] = None  # now the newest
        if self.timeout_keep_alive_task is None:  # a new connection: uvicorn arms it only after a response
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _request_started(self) -> None:
        self._waiting.connections.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._send_timer = None

    # --- limits -----------------------------------------------------------------------------------

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for a request; False if none is waiting."""
        for connection in self._waiting.connections:
            if connection is not self:
                self._waiting.connections.pop(connection)
                connection_stats.evicted += 1
                connection.transport.close()
                self._warn_at_cap("closed the oldest idle connection to make room")
                return True
        return False

    def _refuse(self) -> None:
        self._refused = True
        connection_stats.refused += 1
        self._warn_at_cap("every connection is busy with a request: refusing new ones with 503")
        self.transport.write(_raw_response(503, "Service Unavailable", APIError.too_many_connections()))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    def _warn_at_cap(self, what: str) -> None:
        now = time.monotonic()
        if now - self._waiting.last_warning >= WARNING_INTERVAL_S:
            self._waiting.last_warning = now
            logger.warning("%d connections open (DLLM_MAX_CONNECTIONS): %s", len(self.connections) - 1, what)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            connection_stats.timed_out += 1
        super().timeout_keep_alive_handler()

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._idle() and not self.transport.is_closing():
            connection_stats.timed_out += 1
            self.transport.write(_raw_response(408, "Request Timeout", None))
            self.transport.close()

    def _send_timeout(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            connection_stats.timed_out += 1
            logger.info("closing a connection whose client stopped reading for %gs", self.settings.send_timeout_s)
            self.transport.abort()


_REQUIRED = (
    "connection_made",
    "connection_lost",
    "data_received",
    "eof_received",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "timeout_keep_alive_handler",
    "_unset_keepalive_if_required",
)
_install_lock = threading.Lock()


def install_connection_guard(settings: ServerSettings) -> type:
    """Make uvicorn's "auto" HTTP protocol (what BentoML's worker uses) the guarded one, with `settings`.

    uvicorn resolves `Config.http` through `uvicorn.config.HTTP_PROTOCOLS` when the server loads its
    config, after the service module is imported; this points the "auto" entry at a guarded subclass of
    the class it named. That is uvicorn's internal shape: if it changes, this fails the service's import
    with a message rather than silently serving without the limits.
    """
    from uvicorn import config as uvicorn_config
    from uvicorn.importer import import_from_string

    with _install_lock:
        ConnectionGuardMixin.settings = settings
        current = uvicorn_config.HTTP_PROTOCOLS.get("auto", "")
        if current == f"{__name__}:GuardedProtocol":
            return GuardedProtocol
        base = import_from_string(current)
        missing = [name for name in _REQUIRED if not hasattr(base, name)]
        if missing:
            raise RuntimeError(
                f"uvicorn's HTTP protocol {base.__name__} lacks {missing}: the connection limits cannot be "
                "installed; check server/connections.py against the installed uvicorn version"
            )
        globals()["GuardedProtocol"] = type("GuardedProtocol", (ConnectionGuardMixin, base), {})
        uvicorn_config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedProtocol"
        return GuardedProtocol


GuardedProtocol: type | None = None  # set by install_connection_guard
