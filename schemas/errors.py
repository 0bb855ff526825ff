"""The OpenAI error envelope and every error the HTTP API returns, built in one place.

`APIError` is raised anywhere in request handling; the HTTP layer (api/errors.py) turns it into
`{"error": {"message", "type", "param", "code"}}` with its HTTP status and headers. The constructors
below fix the (status, type, code) triples of every error the server sends, so that no route or
middleware invents its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# The decision record behind every deviation from OpenAI; error messages cite it with its path in the repo.
ADR = "ADR 005"
ADR_DOC = "docs/adr/005-openai-compatible-api.md"
ADR_CITATION = f"{ADR}, {ADR_DOC}"


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and, where it helps, what to send instead.")
    type: str = Field(description="`invalid_request_error` for every 4xx caused by the request.")
    param: str | None = Field(None, description="The request field (or header) at fault, when there is one.")
    code: str | None = Field(
        None,
        description=f"`unsupported_parameter` (rejected by {ADR}), `unknown_parameter`, `invalid_value`, "
        "`invalid_json`, `missing_required_parameter`, `invalid_api_key`, `rate_limit_exceeded`, ...",
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail


class APIError(Exception):
    """An error response: raise it, and the service's handler renders the envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return ErrorResponse(error=self.detail).model_dump()

    # --- 400s -------------------------------------------------------------------------------------

    @classmethod
    def unsupported_parameter(cls, param: str | None, message: str) -> APIError:
        return cls(400, message, param=param, code="unsupported_parameter")

    @classmethod
    def unknown_parameter(cls, param: str | None) -> APIError:
        return cls(400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")

    @classmethod
    def invalid_value(cls, param: str | None, message: str, headers: dict[str, str] | None = None) -> APIError:
        return cls(400, message, param=param, code="invalid_value", headers=headers)

    @classmethod
    def missing_parameter(cls, param: str | None) -> APIError:
        return cls(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")

    @classmethod
    def invalid_json(cls, message: str) -> APIError:
        return cls(400, message, code="invalid_json")

    # --- other statuses ---------------------------------------------------------------------------

    @classmethod
    def invalid_api_key(cls) -> APIError:
        return cls(
            401,
            "Invalid or missing API key: send 'Authorization: Bearer <key>' with the key this server was "
            "started with (DLLM_API_KEY).",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    @classmethod
    def overloaded(cls, retry_after_s: int = 1) -> APIError:
        return cls(
            429,
            "The server's request queue is full; retry after a moment.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after_s)},
        )

    @classmethod
    def not_found(cls, method: str, path: str) -> APIError:
        return cls(404, f"Invalid URL ({method} {path}).", code="not_found")

    @classmethod
    def method_not_allowed(cls, method: str, path: str, allowed: list[str]) -> APIError:
        allow = ", ".join(m for m in allowed if m)
        return cls(
            405,
            f"Method {method} is not allowed on {path}" + (f"; use {allow}." if allow else "."),
            code="method_not_allowed",
            headers={"Allow": allow},
        )

    @classmethod
    def model_not_found(cls, model: str, served: str) -> APIError:
        return cls(
            404,
            f"The model '{model}' does not exist: this server serves '{served}'.",
            param="model",
            code="model_not_found",
        )

    @classmethod
    def request_too_large(cls, limit_bytes: int) -> APIError:
        return cls(
            413,
            f"The request body is larger than this server accepts ({limit_bytes} bytes; DLLM_MAX_REQUEST_BYTES).",
            code="request_too_large",
        )

    @classmethod
    def not_ready(cls) -> APIError:
        return cls(
            503,
            "The model is still loading; retry shortly.",
            type=SERVER_ERROR,
            code="model_not_ready",
            headers={"Retry-After": "5"},
        )

    @classmethod
    def shutting_down(cls, retry_after_s: int = 1) -> APIError:
        # Connection: close, so that the client's next attempt opens a connection, which a load balancer
        # sends to another replica.
        return cls(
            503,
            "The server is shutting down; retry (another replica will answer).",
            type=SERVER_ERROR,
            code="shutting_down",
            headers={"Retry-After": str(retry_after_s), "Connection": "close"},
        )

    @classmethod
    def too_many_connections(cls, retry_after_s: int = 1) -> APIError:
        return cls(
            503,
            "The server has as many connections open as it accepts (DLLM_MAX_CONNECTIONS), all busy; retry shortly.",
            type=SERVER_ERROR,
            code="too_many_connections",
            headers={"Retry-After": str(retry_after_s)},
        )

    @classmethod
    def request_timeout(cls, seconds: float) -> APIError:
        # The rest of the body may still be on its way: the connection cannot carry another request.
        return cls(
            408,
            f"The request body did not arrive within {seconds:g} s (DLLM_BODY_TIMEOUT_S).",
            code="request_timeout",
            headers={"Connection": "close"},
        )

    @classmethod
    def unsupported_media_type(cls, content_type: str | None) -> APIError:
        sent = f"'{content_type}'" if content_type else "no Content-Type"
        return cls(
            415,
            f"The request body must be JSON, sent with 'Content-Type: application/json'; this request has {sent}.",
            param="Content-Type",
            code="unsupported_media_type",
        )

    @classmethod
    def unsupported_content_encoding(cls, encoding: str) -> APIError:
        return cls(
            415,
            f"The request body must be sent unencoded: this server does not decode 'Content-Encoding: {encoding}'.",
            param="Content-Encoding",
            code="unsupported_media_type",
        )

    @classmethod
    def timeout(cls, seconds: float) -> APIError:
        return cls(504, f"No response within {seconds:g} s.", type=SERVER_ERROR, code="timeout")

    @classmethod
    def internal(cls, request_id: str) -> APIError:
        return cls(
            500,
            f"The server failed while processing the request (request id {request_id}); the failure is logged.",
            type=SERVER_ERROR,
            code="internal_error",
        )


# --- Pydantic validation errors → one APIError ------------------------------------------------------

# Error kinds in the order a client should fix them: the first present wins.
_PRIORITY = {
    "json_invalid": 0,
    "unsupported_parameter": 1,
    "extra_forbidden": 2,
    "missing": 3,
}


def _param_path(loc: tuple, known_fields: frozenset[str], keep_last: bool) -> str:
    """`('messages', 0, 'content')` → `messages[0].content`.

    Union members add their own segments to `loc` (`'str'`, `'list[str]'`): only names of our fields and
    list indices are kept. `keep_last` keeps the final segment regardless (an unknown field's name).
    """
    path = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in known_fields or (keep_last and i == len(loc) - 1):
            path += f".{part}" if path else part
    return path


def error_from_validation(exc: ValidationError, known_fields: frozenset[str]) -> APIError:
    """The single most useful error of a failed validation, in the OpenAI envelope."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: _PRIORITY.get(e["type"], 9))
    first = errors[0]
    kind = first["type"]
    ctx = first.get("ctx") or {}
    param = ctx.get("param") or _param_path(first["loc"], known_fields, keep_last=kind == "extra_forbidden") or None
    if kind == "json_invalid":
        return APIError.invalid_json(f"The request body is not valid JSON: {ctx.get('error', first['msg'])}.")
    if kind == "unsupported_parameter":
        return APIError.unsupported_parameter(param, first["msg"])
    if kind == "extra_forbidden":
        return APIError.unknown_parameter(param)
    if kind == "missing":
        return APIError.missing_parameter(param)
    if kind == "invalid_value":  # our own cross-field and shape checks: their message is complete
        return APIError.invalid_value(param, first["msg"])
    # Union fields report one error per member: say which types are allowed instead of only the first.
    same_param = [e for e in errors if _param_path(e["loc"], known_fields, keep_last=False) == param]
    if len(same_param) > 1:
        reasons = "; or ".join(dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in same_param))
        return APIError.invalid_value(param, f"Invalid value for '{param}': input should be {reasons}.")
    return APIError.invalid_value(param, f"Invalid value for '{param}': {first['msg']}.")
