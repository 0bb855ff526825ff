"""The service's logging setup: its own lines shown at DLLM_LOG_LEVEL, each request logged once.

`configure_logging` runs in the worker once BentoML has configured logging (the service's `load_engine`).
"""

from __future__ import annotations

import logging
import os

# The mounted app logs each of its requests itself, with the request id (api/middleware.py), and so do
# BentoML's API routes (/generate, /generate_stream: server/native.py); BentoML's access log would log them a
# second time. Its lines for BentoML's other routes (/readyz, /metrics, ...) stay.
APP_PATHS = ("/v1/", "/docs", "/redoc", "/openapi.json", "/playground", "/generate")


class SkipRequestsTheAppLogs(logging.Filter):
    """Drops `bentoml.access` lines for the mounted app's paths, so that each request is logged once.

    BentoML 1.4's access middleware logs `"%s (%s) (%s) %.3fms"` with the request's `scheme=..,method=..,
    path=..` as the second argument; anything else passes through unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 4 and isinstance(args[1], str) and ",path=" in args[1]:
            path = args[1].partition(",path=")[2].split(",")[0]
            return not path.startswith(APP_PATHS)
        return True


def configure_logging() -> None:
    """Show the service's own log lines (request lines are INFO) at DLLM_LOG_LEVEL.

    BentoML's logging config keeps the root at WARNING and disables loggers created before it: every
    logger under "dllm_serve" (one per module of api/ and server/) is enabled again and takes this level.
    """
    from server.native import install_log_filter

    install_log_filter()
    logging.getLogger("dllm_serve").setLevel(os.environ.get("DLLM_LOG_LEVEL", "INFO").upper())
    access = logging.getLogger("bentoml.access")
    if not any(isinstance(f, SkipRequestsTheAppLogs) for f in access.filters):
        access.addFilter(SkipRequestsTheAppLogs())
    for name, child in logging.Logger.manager.loggerDict.items():
        if (name == "dllm_serve" or name.startswith("dllm_serve.")) and isinstance(child, logging.Logger):
            child.disabled = False
