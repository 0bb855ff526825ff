"""The server's settings, read from the environment once, at startup, and checked together.

Every connection phase has a time limit (docs/reliability.md says which layer enforces which):
- DLLM_KEEP_ALIVE_TIMEOUT_S: a connection with no request in progress and no byte of the next one is
  closed after this long (also a connection that never sends anything);
- DLLM_HEADER_TIMEOUT_S: from a request's first byte, its headers must be complete within this long;
- DLLM_BODY_TIMEOUT_S: from the end of the headers, the whole body must arrive within this long (408);
- DLLM_SEND_TIMEOUT_S: a response the client stops reading is cut after this long without progress;
- DLLM_SHUTDOWN_GRACE_S: on SIGTERM, how long running requests may take to finish.
DLLM_MAX_CONNECTIONS caps open connections; DLLM_CORS_ORIGINS turns CORS on for the listed origins.
The app's own settings (`ApiSettings`: DLLM_MAX_REQUEST_BYTES, DLLM_API_KEY) are read here too, and handed
to `create_app` (service.py): the app never reads the environment itself.
An invalid value is an error that names the variable; the service refuses to start on one.
"""

from __future__ import annotations

import logging
import math
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field

from api.settings import DEFAULT_MAX_REQUEST_BYTES, ApiSettings

# Descriptors a worker needs besides connections: model and tokenizer files, logs, the event loop's own.
RESERVED_FILE_DESCRIPTORS = 256
# Above this many open connections a single worker's event loop is the bottleneck anyway.
DEFAULT_MAX_CONNECTIONS = 4096


def default_max_connections() -> int:
    """DEFAULT_MAX_CONNECTIONS, or fewer when the process's file-descriptor limit would run out first."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft - RESERVED_FILE_DESCRIPTORS))


@dataclass(frozen=True)
class ServerSettings:
    keep_alive_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 60.0
    shutdown_grace_s: float = 30.0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    cors_origins: tuple[str, ...] = ()
    api: ApiSettings = field(default_factory=ApiSettings)  # what the mounted app is created with

    ENV_VARS = {
        "keep_alive_timeout_s": "DLLM_KEEP_ALIVE_TIMEOUT_S",
        "header_timeout_s": "DLLM_HEADER_TIMEOUT_S",
        "body_timeout_s": "DLLM_BODY_TIMEOUT_S",
        "send_timeout_s": "DLLM_SEND_TIMEOUT_S",
        "shutdown_grace_s": "DLLM_SHUTDOWN_GRACE_S",
        "max_connections": "DLLM_MAX_CONNECTIONS",
        "cors_origins": "DLLM_CORS_ORIGINS",
    }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """The defaults overridden by the DLLM_* variables above; raises ValueError naming a bad one.

        Also reads the app's settings (`api`) and checks DLLM_LOG_LEVEL (read by server/logs.py when the
        worker starts), so that one call validates everything the HTTP side is configured with.
        """
        environ = os.environ if environ is None else environ
        values: dict = {"max_connections": default_max_connections()}
        for name, var in cls.ENV_VARS.items():
            raw = environ.get(var, "").strip()
            if not raw:
                continue
            if name == "cors_origins":
                values[name] = _origins(var, raw)
            elif name == "max_connections":
                values[name] = _positive_int(var, raw)
            else:
                values[name] = _positive_seconds(var, raw)
        values["api"] = ApiSettings(
            max_request_bytes=max_request_bytes(environ), api_key=environ.get("DLLM_API_KEY") or None
        )
        _check_log_level(environ.get("DLLM_LOG_LEVEL", ""))
        return cls(**values)

    def cors_options(self) -> dict:
        """Starlette CORSMiddleware options for a browser page on another origin that calls /v1 with
        fetch: JSON bodies, a bearer key, and the request id and Retry-After readable by the page."""
        return {
            "allow_origins": list(self.cors_origins),
            "allow_methods": ["GET", "POST"],
            "allow_headers": ["Authorization", "Content-Type", "X-Request-ID"],
            "expose_headers": ["X-Request-ID", "Retry-After"],
            "allow_credentials": False,  # the API key travels in a header, never in a cookie
            "max_age": 600,
        }


def max_request_bytes(environ: Mapping[str, str] | None = None) -> int:
    """DLLM_MAX_REQUEST_BYTES, else the default; raises ValueError on anything but a positive integer."""
    raw = (os.environ if environ is None else environ).get("DLLM_MAX_REQUEST_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_REQUEST_BYTES
    if not _is_ascii_number(raw) or int(raw) < 1:
        raise ValueError(f"DLLM_MAX_REQUEST_BYTES={raw!r}: must be a positive integer (bytes)")
    return int(raw)


# Below this a time limit cannot be met by any client (1e-9 s would close every connection as it opens): a
# typo, not a setting.
MIN_SECONDS = 0.1


def _is_ascii_number(raw: str) -> bool:
    """Digits 0-9 only. `str.isdigit` also takes "²" (which `int` then refuses) and `int` takes "٣" and "1_000"."""
    return raw.isascii() and raw.isdigit()


def _positive_seconds(var: str, raw: str) -> float:
    try:
        value = float(raw) if raw.isascii() else math.nan  # float, too, reads other scripts' digits
    except ValueError:
        value = math.nan
    if not (value >= MIN_SECONDS and math.isfinite(value)):
        raise ValueError(f"{var}={raw!r}: must be a number of seconds, at least {MIN_SECONDS:g}")
    return value


def _positive_int(var: str, raw: str) -> int:
    if not _is_ascii_number(raw) or int(raw) < 1:
        raise ValueError(f"{var}={raw!r}: must be a positive integer")
    return int(raw)


def _origins(var: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list of origins (scheme://host[:port]), or * for any."""
    origins = tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    for origin in origins:
        if origin == "*":
            continue
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
            raise ValueError(f"{var}={raw!r}: each origin must be scheme://host[:port] (no path), or *; got {origin!r}")
    return origins


def _check_log_level(raw: str) -> None:
    level = raw.strip().upper()
    if level and not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"DLLM_LOG_LEVEL={raw!r}: must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
