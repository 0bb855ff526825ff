"""Pure ASGI middlewares around the whole host app (BentoML's routes and the mounted API): the request guard,
and the response-start timeout that replaces BentoML's.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer streams and hide client
disconnects.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from api.middleware import RequestContextMiddleware
from api.settings import key_matches
from schemas.errors import APIError
from server.bentoml_internals import bentoml_class
from server.drain import Drain
from server.native import REFUSAL_KEY, ErrorEnvelope
from server.settings import ServerSettings

# Served while the server drains: the probes must keep telling the truth, and metrics keep being scraped.
PROBE_PATHS = frozenset({"/livez", "/readyz", "/healthz", "/metrics"})
# Methods whose body the server reads: it must be JSON.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str | None) -> bool:
    """`application/json`, with no parameter but an optional UTF-8 charset (JSON is UTF-8, RFC 8259)."""
    if not content_type:
        return False
    media_type, *parameters = (part.strip().lower() for part in content_type.split(";"))
    return media_type == "application/json" and all(p in ("", "charset=utf-8", 'charset="utf-8"') for p in parameters)


def has_body(headers: Headers) -> bool:
    """Whether the request announces a body (HTTP/1.1 has no other way to send one)."""
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


class RequestGuard:
    """What every request passes before it is routed (the service installs it around the whole app).

    - While the server drains (server/drain.py), a new request gets a 503 `shutting_down` with
      `Retry-After`; the probes and /metrics are still served. The others are counted as running.
    - A POST, PUT or PATCH with a body must carry `Content-Type: application/json`, else a 415. A body in any
      other type is refused unread: without it, any web page could make a browser send work here with a CORS
      "simple request" (text/plain or a form), which needs no preflight. A request without a body goes on to
      its route (which answers a 405 for a wrong method, a 400 for a missing JSON body). A body sent with a
      `Content-Encoding` (gzip, br, ...) is a 415 too: nothing here decodes it, and read as JSON it would be
      a misleading 400, or worse, taken for plain bytes.
    - A body larger than `max_request_bytes` is a 413: at once from its Content-Length, else as soon as the
      bytes received pass the limit. The body must arrive within `body_timeout_s` of the request's start, else
      a 408 that closes the connection, so a slow or stalled upload cannot hold a request open; one still
      arriving when the drain begins gets the 503 instead. Both hold on every route (/v1 and BentoML's).
    - BentoML's own API routes (`native_routes`: /generate, /generate_stream) run the engine, so with an API
      key set they need it as /v1 does (401 otherwise); they answer in the server's envelope, with
      X-Request-ID (server/native.py, `ErrorEnvelope`). Elsewhere BentoML's plain-text 404s and 405s get the
      envelope too.
    Its own refusals carry X-Request-ID and are logged like any request (through RequestContextMiddleware).
    """

    def __init__(
        self, app: ASGIApp, drain: Drain, settings: ServerSettings, native_routes: frozenset[str] = frozenset()
    ):
        self.app = app
        self.drain = drain
        self.body_timeout_s = settings.body_timeout_s
        self.max_request_bytes = settings.api.max_request_bytes
        self.api_key = settings.api.api_key
        self.native_routes = native_routes
        self.native_app = RequestContextMiddleware(ErrorEnvelope(app, every_error=True))
        self.other_app = ErrorEnvelope(app, every_error=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope["path"] not in PROBE_PATHS:
            await self._refuse(APIError.shutting_down(), scope, receive, send)
            return
        native = scope["path"] in self.native_routes
        refusal = self._refusal(Headers(scope=scope), scope["method"], native)
        if refusal is not None:
            await self._refuse(refusal, scope, receive, send)
            return
        started = {"response": False}

        async def send_and_mark(message: Message) -> None:
            started["response"] = True
            await send(message)

        with self.drain.track():
            try:
                app = self.native_app if native else self.other_app
                await app(scope, self._body_in_time(scope, receive), send_and_mark)
            except APIError as error:  # raised by the receive below, in an app that did not answer it itself
                if started["response"]:
                    raise
                await self._refuse(error, scope, receive, send)

    def _refusal(self, headers: Headers, method: str, native: bool) -> APIError | None:
        """What the request's head alone refuses, if anything (before routing, before any byte of the body)."""
        if method in BODY_METHODS and has_body(headers):
            content_type = headers.get("content-type")
            if not is_json(content_type):
                return APIError.unsupported_media_type(content_type)
            encoding = headers.get("content-encoding", "").strip().lower()
            if encoding not in ("", "identity"):
                return APIError.unsupported_content_encoding(encoding)
            declared = headers.get("content-length", "").strip()
            if declared.isascii() and declared.isdigit() and int(declared) > self.max_request_bytes:
                return APIError.request_too_large(self.max_request_bytes)
        if native and self.api_key is not None and not key_matches(headers.get("authorization"), self.api_key):
            return APIError.invalid_api_key()
        return None

    def _body_in_time(self, scope: Scope, receive: Receive) -> Receive:
        """`receive`, but while the body is arriving each wait ends at the body's deadline or the drain, and the
        body ends at `max_request_bytes`. A refusal is raised, and recorded for `ErrorEnvelope` (BentoML's own
        routes catch what their body read raises, and would answer a 500)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        body_done = False
        received = 0

        def refused(error: APIError) -> APIError:
            scope.setdefault("state", {})[REFUSAL_KEY] = error
            return error

        async def receive_in_time() -> Message:
            nonlocal body_done, received
            if body_done:  # later receives wait for the disconnect: that wait is the app's business
                return await receive()
            message_task = asyncio.ensure_future(receive())
            drain_task = asyncio.ensure_future(self.drain.begun.wait())
            try:
                remaining = max(0.0, deadline - loop.time())
                await asyncio.wait({message_task, drain_task}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                drain_task.cancel()
            if not message_task.done():
                message_task.cancel()
                if self.drain.draining:
                    raise refused(APIError.shutting_down())
                raise refused(APIError.request_timeout(self.body_timeout_s))
            message = message_task.result()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_request_bytes:
                    raise refused(APIError.request_too_large(self.max_request_bytes))
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return receive_in_time

    @staticmethod
    async def _refuse(error: APIError, scope: Scope, receive: Receive, send: Send) -> None:
        await RequestContextMiddleware(error_response(error))(scope, receive, send)


class ResponseStartTimeout:
    """`traffic.timeout` as BentoML 1.4 means it (a 504 if no response has started in time), minus a leak.

    BentoML's TimeoutMiddleware arms a timer per request and never cancels it, so every finished request
    stays referenced by its timer, with its context and tracing span (~7 KB), for the whole timeout: an
    hour in this service. This version waits with `asyncio.wait`, whose timer is cancelled.
    `install_response_start_timeout` puts it in BentoML's place.
    """

    def __init__(self, app: ASGIApp, timeout: float):
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = asyncio.Event()

        async def send_and_mark(message: Message) -> None:
            started.set()
            await send(message)

        app = asyncio.ensure_future(self.app(scope, receive, send_and_mark))
        start_seen = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({app, start_seen}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            start_seen.cancel()
        if not started.is_set() and not app.done():
            app.cancel()
            await error_response(APIError.timeout(self.timeout))(scope, receive, send)
            return
        await app


def install_response_start_timeout() -> None:
    """Make BentoML build `ResponseStartTimeout` where it would build its own TimeoutMiddleware.

    BentoML 1.4 looks the class up as `bentoml._internal.server.http.traffic.TimeoutMiddleware` when it
    creates the app (after the service module is imported), and constructs it as `(app, timeout=...)`.
    That is an internal: if it moves or changes shape, this fails the import of the service with a
    message rather than silently leaving the leaking version in place.
    """
    traffic, _ = bentoml_class(
        "bentoml._internal.server.http.traffic",
        "TimeoutMiddleware",
        ["app", "timeout"],
        "ResponseStartTimeout",
        "server/middleware.py",
    )
    # Replacing the class is the point: type checkers object to assigning to a class name.
    traffic.TimeoutMiddleware = ResponseStartTimeout  # type: ignore[misc, assignment]
