"""From failures to HTTP responses: the engine's exceptions mapped to statuses, in one place.

Only the engine's invalid-input exception (`InvalidParameter`) blames the client (400). A full queue
is a 429 and a stopping engine a 503. Anything else is not the client's fault: it propagates to
`RequestContextMiddleware`, which logs the traceback and answers a 500 that carries the request id.
The error envelope and every (status, type, code) triple live in schemas/errors.py.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse, Response

from engine.errors import EngineOverloaded, EngineShutdown, InvalidParameter
from engine.params import DEFAULT_GEN_LENGTH, SamplingParams
from schemas.errors import APIError
from schemas.sampling import GenerationRequest

logger = logging.getLogger(f"dllm_serve.{__name__}")

OVERLOAD_RETRY_AFTER_S = 1
# nginx's "client closed request": the client is gone, so nobody reads this response, but every exchange
# must still end with one (BentoML's timeout middleware and a graceful shutdown wait for it).
CLIENT_CLOSED_REQUEST = 499


def error_response(error: APIError) -> JSONResponse:
    # X-Request-ID is added by RequestContextMiddleware, like on every other response.
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def client_gone() -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def invalid_parameter_error(error: InvalidParameter, generation: GenerationRequest) -> APIError:
    """An engine InvalidParameter, reported under the request field the client sent."""
    param = generation.http_param(error.field)
    message = f"Invalid value for '{param}': {error.rule}"
    if error.field != "gen_length" and "gen_length" in error.rule:
        message += f"; gen_length is the canvas size, set by {generation.canvas_field} (default {DEFAULT_GEN_LENGTH})"
    return APIError.invalid_value(param, message.rstrip(".") + ".")


def stopped_engine_error(error: Exception) -> APIError | None:
    """The 503 for a request the engine dropped because it is stopping (the end of a drain's grace period);
    None for any other failure."""
    return APIError.shutting_down() if isinstance(error, EngineShutdown) else None


def engine_error(error: Exception, generation: GenerationRequest) -> APIError | None:
    """The HTTP error for what the engine raised before a request's first event; None: a server fault,
    to be answered with a 500 (a ValueError from a bug in the engine is one too, not a 400)."""
    if isinstance(error, InvalidParameter):
        return invalid_parameter_error(error, generation)
    if isinstance(error, EngineOverloaded):
        logger.warning("rejected with 429: %s", error)
        return APIError.overloaded(OVERLOAD_RETRY_AFTER_S)
    if isinstance(error, EngineShutdown):
        return APIError.shutting_down()
    return None


def sampling_params(generation: GenerationRequest, defaults: Any = None) -> SamplingParams:
    """The engine's parameters for a request the schema typed: where the knobs' ranges and rules are checked
    (once, by `SamplingParams`), a broken one failing as the 400 on the request's field. `defaults`: the loaded
    model family's sampler settings (`engine.sampler_defaults`), for what the request leaves out."""
    try:
        return generation.sampling_params(defaults)
    except InvalidParameter as error:
        raise invalid_parameter_error(error, generation) from None
