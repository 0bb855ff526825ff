"""The BentoML service: loads the diffusion engine on startup and mounts the OpenAI-compatible app at "/".

Only what BentoML needs lives here: resources and traffic settings, startup and shutdown, readiness and
metrics. The HTTP layer is the `api` package (start at api/app.py); the engine is `engine`. torch is
imported lazily (in `load_engine`) so that `bentoml build`, which imports this file, stays cheap.

Configuration (environment; docs/deploy.md has the table): DLLM_MODEL (a local directory or hub id;
default: the embedded models/tiny-llada-chat), DLLM_DEVICE, DLLM_DTYPE, DLLM_COMPILE, the scheduler's
DLLM_MAX_BATCH_SIZE / DLLM_MAX_WAITING / DLLM_MAX_WAIT_MS / DLLM_KV_CACHE_BUDGET_MB / DLLM_MAX_PREPARING,
DLLM_API_KEY, DLLM_MAX_REQUEST_BYTES, DLLM_LOG_LEVEL, and the connection limits of api/settings.py
(timeouts, DLLM_MAX_CONNECTIONS, DLLM_SHUTDOWN_GRACE_S, DLLM_CORS_ORIGINS).

An invalid setting stops `bentoml serve` before any worker starts, with a message naming it: the HTTP
settings are read when this module is imported (the `bentoml serve` process imports it first), the
engine's by `check_configuration`. Otherwise BentoML would restart the failing worker forever.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import bentoml
from starlette.middleware.cors import CORSMiddleware

from api.app import create_app
from api.connections import connection_stats, install_connection_guard
from api.drain import Drain
from api.middleware import RequestGuard, install_response_start_timeout
from api.settings import ServerSettings

if TYPE_CHECKING:
    from engine import DiffusionEngine

logger = logging.getLogger("dllm_serve")

try:
    settings = ServerSettings.from_env()
except ValueError as error:
    raise SystemExit(f"dllm-serve: invalid configuration: {error}") from None
drain = Drain(settings.shutdown_grace_s)
app = create_app()

# Before BentoML builds its middleware stack (when the service's app is created, after this import) and
# before uvicorn loads its config (after that).
install_response_start_timeout()
install_connection_guard(settings)


def configure_logging() -> None:
    """Show the service's own log lines (request lines are INFO) at DLLM_LOG_LEVEL.

    BentoML's logging config keeps the root at WARNING and disables loggers created before it: every
    logger under "dllm_serve" (one per api/ module) is enabled again and takes this level.
    """
    logger.setLevel(os.environ.get("DLLM_LOG_LEVEL", "INFO").upper())
    for name, child in logging.Logger.manager.loggerDict.items():
        if (name == "dllm_serve" or name.startswith("dllm_serve.")) and isinstance(child, logging.Logger):
            child.disabled = False


@bentoml.asgi_app(app, path="/")
@bentoml.service(
    name="dllm-serve",
    # One process owns the model and batches inside it; scale out with replicas, not workers.
    workers=1,
    # The timeout ends at the response headers (api.middleware.ResponseStartTimeout): a long non-stream
    # generation must not be cut by a 504. The engine's bounded queue (429) is the overload protection.
    traffic={"timeout": 3600, "concurrency": 32},
    resources={"gpu": 1},  # deployment target; on a CPU-only machine BentoML only warns
)
class DiffusionLLMService:
    @property
    def engine(self) -> DiffusionEngine | None:
        """The loaded engine, kept where the routes look for it (api.app.serving_engine); None until loaded."""
        return app.state.engine

    @engine.setter
    def engine(self, engine: DiffusionEngine | None) -> None:
        app.state.engine = engine

    @bentoml.on_deployment
    def check_configuration() -> None:
        """Once, in the `bentoml serve` process, before any worker starts: what `load_engine` would refuse in
        the configuration, checked without loading the model (`check_engine_configuration`).

        It runs in a child process so that the long-lived `bentoml serve` process does not import torch.
        """
        check = [sys.executable, "-c", CHECK_IN_CHILD]
        result = subprocess.run(check, cwd=Path(__file__).parent, capture_output=True, text=True)
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines()
            # SystemExit: the message is the whole story, a traceback of BentoML's serve command would bury it.
            raise SystemExit(f"dllm-serve: invalid configuration: {lines[-1] if lines else result.returncode}")

    @bentoml.on_startup
    def load_engine(self) -> None:
        # Before torch loads: OpenMP reads its environment once. CPU threads only run the model on a CPU; on a
        # GPU they run small host-side ops. With OpenMP's spinning workers, a request took 0.5-16 s instead
        # of 0.1 s when another torch process shared the cores; one thread is immune to that and,
        # for the embedded model, also faster than several sleeping (PASSIVE) ones: benchmarks/cpu_threads.py.
        # A large model on a many-core CPU wants OMP_NUM_THREADS=<cores>: PASSIVE then keeps it safe.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from engine import DiffusionEngine

        configure_logging()

        model = os.environ.get("DLLM_MODEL") or None
        device = os.environ.get("DLLM_DEVICE") or None
        dtype = os.environ.get("DLLM_DTYPE") or None
        started = time.perf_counter()
        engine = DiffusionEngine.from_pretrained(model, device=device, dtype=dtype)
        logger.info(
            "loaded %s on %s (%s) in %.1fs; scheduler %s",
            engine.model_name,
            engine.device,
            next(engine.model.parameters()).dtype,
            time.perf_counter() - started,
            engine.scheduler_config,
        )
        self.engine = engine
        # On the serving loop's thread: SIGTERM now drains before uvicorn's own handler runs (api/drain.py).
        if drain.intercept_signals(asyncio.get_running_loop(), on_grace_expired=self.stop_engine):
            logger.info("SIGTERM drains: running requests get up to %gs (DLLM_SHUTDOWN_GRACE_S)", drain.grace_s)

    def __is_ready__(self) -> bool:
        return self.engine is not None and not drain.draining

    def __metrics__(self, text: str) -> str:
        text += connection_stats.prometheus_text()
        if self.engine is None:
            return text
        return text + self.engine.stats.prometheus_text()

    @bentoml.on_shutdown
    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


# Around the whole app, BentoML's routes included; the first added is the outermost. CORS first, so that
# every answer a browser page gets (the guard's 503s and 415s too) carries its headers.
if settings.cors_origins:
    DiffusionLLMService.add_asgi_middleware(CORSMiddleware, **settings.cors_options())
DiffusionLLMService.add_asgi_middleware(RequestGuard, drain=drain, body_timeout_s=settings.body_timeout_s)


# Run by `check_configuration` in a child process: the error's message alone on stderr, exit status 1.
CHECK_IN_CHILD = """
import service
try:
    service.check_engine_configuration()
except (ValueError, OSError) as error:
    raise SystemExit(str(error))
"""


def check_engine_configuration() -> None:
    """Raise (ValueError, FileNotFoundError) on an engine setting that `load_engine` would refuse.

    Cheap: reads the environment and, for a local DLLM_MODEL, its config.json; never loads weights or
    contacts the hub (a hub id is checked when the worker fetches it).
    """
    from engine import SchedulerConfig
    from engine.config import read_config
    from engine.loading import compile_from_env, dtype_from_name, local_model_dir

    SchedulerConfig.from_env()
    compile_from_env()
    if dtype := os.environ.get("DLLM_DTYPE"):
        dtype_from_name(dtype)
    if device := os.environ.get("DLLM_DEVICE"):
        import torch

        try:
            torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"DLLM_DEVICE={device!r}: {error}") from None
    model = os.environ.get("DLLM_MODEL") or None
    try:
        local = local_model_dir(model)  # None for a hub id
    except FileNotFoundError as error:
        raise FileNotFoundError(f"DLLM_MODEL={model!r}: {error}") from None
    if local is not None:
        try:
            read_config(local)
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"DLLM_MODEL={model!r}: not a checkpoint this engine can load ({error})") from None
