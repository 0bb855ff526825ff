"""The app's own middleware: the request context (X-Request-ID, the request log line, last-resort 500s).

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer streams and hide client
disconnects. The middlewares that guard the whole host (BentoML's routes too) are in server/middleware.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import client_gone, error_response
from schemas.errors import APIError
from schemas.request_id import REQUEST_ID_HEADER, is_valid_request_id, new_request_id

logger = logging.getLogger(f"dllm_serve.{__name__}")


class RequestContextMiddleware:
    """X-Request-ID, the request log line, and last-resort 500s.

    Assigns the request id (the client's, validated, or a new UUIDv7), puts it in `request.state`, adds
    it to every response (streams included), logs one line per request when it ends, and turns an
    unhandled exception into a 500 in the OpenAI envelope (with the request id; the traceback goes to
    the log) if no response has started yet.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        response: dict[str, Any] = {"status": None}

        sent_id = Headers(scope=scope).get(REQUEST_ID_HEADER)
        request_id = sent_id if sent_id is not None and is_valid_request_id(sent_id) else new_request_id()
        state["request_id"] = request_id

        async def send_with_request_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            if sent_id is not None and sent_id != request_id:
                error = APIError.invalid_value(
                    REQUEST_ID_HEADER,
                    f"Invalid {REQUEST_ID_HEADER} header: it must be 1–128 printable ASCII characters without "
                    f"spaces. This response carries a generated id ({request_id}) instead.",
                )
                await error_response(error)(scope, receive, send_with_request_id)
            else:
                await self.app(scope, receive, send_with_request_id)
        except ClientDisconnect:  # the client left while the body was read or the stream written
            state["disconnected"] = True
            if response["status"] is None:
                # Nobody will read it, but the exchange must end with a response: BentoML's timeout
                # middleware waits for the first one (up to traffic.timeout), and that pending task would
                # also hold up the server's shutdown.
                await client_gone()(scope, receive, send_with_request_id)
        except Exception:
            logger.exception("request %s failed", request_id)
            if response["status"] is not None:
                raise  # mid-response: nothing left to tell the client
            await error_response(APIError.internal(request_id))(scope, receive, send_with_request_id)
        finally:
            logger.info(
                '"%s %s" %s %.0fms request_id=%s%s%s',
                scope["method"],
                scope["path"],
                response["status"],
                (time.perf_counter() - started) * 1000,
                request_id,
                "".join(f" {name}={value!r}" for name, value in state.get("logged", {}).items()),
                " (client disconnected)" if state.get("disconnected") else "",
            )
