"""Pure ASGI middlewares around the whole host app (BentoML's routes and the mounted API): the request guard,
and the response-start timeout that replaces BentoML's.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer streams and hide client
disconnects.
"""

from __future__ import annotations

import asyncio
import inspect

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from api.middleware import RequestContextMiddleware
from schemas.errors import APIError
from server.drain import Drain

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
      its route (which answers a 405 for a wrong method, a 400 for a missing JSON body).
    - The body must arrive within `body_timeout_s` of the request's start, else a 408 that closes the
      connection, so a slow or stalled upload cannot hold a request open; one still arriving when the drain
      begins gets the 503 instead.
    Its own refusals carry X-Request-ID and are logged like any request (through RequestContextMiddleware).
    """

    def __init__(self, app: ASGIApp, drain: Drain, body_timeout_s: float):
        self.app = app
        self.drain = drain
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope["path"] not in PROBE_PATHS:
            await self._refuse(APIError.shutting_down(), scope, receive, send)
            return
        headers = Headers(scope=scope)
        content_type = headers.get("content-type")
        if scope["method"] in BODY_METHODS and has_body(headers) and not is_json(content_type):
            await self._refuse(APIError.unsupported_media_type(content_type), scope, receive, send)
            return
        started = {"response": False}

        async def send_and_mark(message: Message) -> None:
            started["response"] = True
            await send(message)

        with self.drain.track():
            try:
                await self.app(scope, self._body_in_time(receive), send_and_mark)
            except APIError as error:  # raised by the receive below, in an app that did not answer it itself
                if started["response"]:
                    raise
                await self._refuse(error, scope, receive, send)

    def _body_in_time(self, receive: Receive) -> Receive:
        """`receive`, but while the body is arriving each wait ends at the body's deadline or the drain."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        body_done = False

        async def receive_in_time() -> Message:
            nonlocal body_done
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
                    raise APIError.shutting_down()
                raise APIError.request_timeout(self.body_timeout_s)
            message = message_task.result()
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
    try:
        from bentoml._internal.server.http import traffic
    except ImportError as error:
        raise RuntimeError(
            f"BentoML's traffic middleware module moved ({error}): ResponseStartTimeout cannot replace its "
            "TimeoutMiddleware; check server/middleware.py against the installed BentoML version"
        ) from None
    current = getattr(traffic, "TimeoutMiddleware", None)
    if current is ResponseStartTimeout:
        return
    if current is None or list(inspect.signature(current).parameters)[:2] != ["app", "timeout"]:
        raise RuntimeError(
            "BentoML's TimeoutMiddleware is gone or takes other arguments than (app, timeout): "
            "ResponseStartTimeout cannot replace it; check server/middleware.py against the installed BentoML version"
        )
    # Replacing the class is the point: type checkers object to assigning to a class name.
    traffic.TimeoutMiddleware = ResponseStartTimeout  # type: ignore[misc, assignment]
