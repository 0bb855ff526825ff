"""The BentoML service: loads the diffusion engine on startup and mounts the OpenAI-compatible app at "/".

Only what BentoML needs lives here: resources and traffic settings, startup and shutdown, readiness and
metrics, and BentoML's own API (`generate`, `generate_stream`: thin wrappers of api/native.py). The HTTP
layer is the `api` package (start at api/app.py); the engine is `engine`. torch is
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
from collections.abc import AsyncGenerator
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import bentoml
from pydantic import Field
from starlette.middleware.cors import CORSMiddleware

from api import native
from api.app import create_app
from api.connections import connection_stats, install_connection_guard
from api.docs import SERVICE_DESCRIPTION
from api.drain import Drain
from api.middleware import RequestGuard, install_response_start_timeout
from api.settings import ServerSettings
from schemas.errors import APIError

if TYPE_CHECKING:
    from engine import DiffusionEngine
    from schemas.chat import ChatCompletionRequest

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


# The mounted app logs each of its requests itself, with the request id (api/middleware.py); BentoML's
# access log would log them a second time. Its lines for BentoML's own routes (/generate, /readyz, ...) stay.
APP_PATHS = ("/v1/", "/docs", "/redoc", "/openapi.json", "/playground")


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
    logger under "dllm_serve" (one per api/ module) is enabled again and takes this level.
    """
    logger.setLevel(os.environ.get("DLLM_LOG_LEVEL", "INFO").upper())
    access = logging.getLogger("bentoml.access")
    if not any(isinstance(f, SkipRequestsTheAppLogs) for f in access.filters):
        access.addFilter(SkipRequestsTheAppLogs())
    for name, child in logging.Logger.manager.loggerDict.items():
        if (name == "dllm_serve" or name.startswith("dllm_serve.")) and isinstance(child, logging.Logger):
            child.disabled = False


class DescribedService(bentoml.Service):
    """BentoML's index page (`/`) shows the service's `doc`, which until the service is built into a Bento is
    a generic README ("This is a Machine Learning Service created with BentoML"): show the description."""

    @property
    def doc(self) -> str:
        if self.bento is not None and self.bento.doc:
            return self.bento.doc
        return self.description or ""


def bentoml_error(error: APIError) -> bentoml.exceptions.BentoMLException:
    """An API error as BentoML's own error response (its API has its own envelope), with the same status."""
    return bentoml.exceptions.BentoMLException(error.detail.message, error_code=HTTPStatus(error.status))


# BentoML's API takes the diffusion settings as plain arguments; None means "the default", as in the HTTP API.
Prompt = Annotated[str, Field(description="The user's message (the model's chat template is applied).")]
SystemPrompt = Annotated[str | None, Field(description="An optional system message.")]
MaxTokens = Annotated[int | None, Field(description="The canvas size in tokens (default 128).")]
Steps = Annotated[int | None, Field(description="Denoising steps, 1–512 (default min(128, max_tokens)).")]
BlockLength = Annotated[int | None, Field(description="Tokens per block (default max_tokens: one block).")]
Temperature = Annotated[float | None, Field(description="0–2 (default 0: deterministic).")]
Seed = Annotated[int | None, Field(description="The random seed (used above temperature 0).")]
LocalLeap = Annotated[bool | None, Field(description="LocalLeap acceleration (default false).")]
KVCache = Annotated[Literal["none", "prefix", "dual"] | None, Field(description="Approximate KV cache.")]
Threshold = Annotated[float | None, Field(description="Threshold decoding: τ in (0, 1] (default off).")]


@bentoml.asgi_app(app, path="/")
@bentoml.service(
    name="dllm-serve",
    description=SERVICE_DESCRIPTION,
    service_class=DescribedService,
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

    # --- BentoML's own API (the OpenAI-compatible one is the mounted app) -----------------------------------

    def _chat(
        self, prompt: str, system_prompt: str | None, **settings
    ) -> tuple[DiffusionEngine, ChatCompletionRequest]:
        if self.engine is None:
            raise bentoml_error(APIError.not_ready())
        try:
            return self.engine, native.chat_request(prompt, system_prompt, settings)
        except APIError as error:
            raise bentoml_error(error) from None

    @bentoml.api
    async def generate(
        self,
        prompt: Prompt,
        system_prompt: SystemPrompt = None,
        max_tokens: MaxTokens = None,
        num_denoising_steps: Steps = None,
        block_length: BlockLength = None,
        temperature: Temperature = None,
        seed: Seed = None,
        use_local_leap: LocalLeap = None,
        kv_cache: KVCache = None,
        confidence_threshold: Threshold = None,
    ) -> str:
        """The answer to one user message, generated by diffusion."""
        engine, chat = self._chat(
            prompt, system_prompt, max_tokens=max_tokens, num_denoising_steps=num_denoising_steps,
            block_length=block_length, temperature=temperature, seed=seed, use_local_leap=use_local_leap,
            kv_cache=kv_cache, confidence_threshold=confidence_threshold,
        )  # fmt: skip
        try:
            return await native.generate_text(engine, chat)
        except APIError as error:
            raise bentoml_error(error) from None

    @bentoml.api
    async def generate_stream(
        self,
        prompt: Prompt,
        system_prompt: SystemPrompt = None,
        max_tokens: MaxTokens = None,
        num_denoising_steps: Steps = None,
        block_length: BlockLength = None,
        temperature: Temperature = None,
        seed: Seed = None,
        use_local_leap: LocalLeap = None,
        kv_cache: KVCache = None,
        confidence_threshold: Threshold = None,
    ) -> AsyncGenerator[str, None]:
        """The answer as it becomes final: one piece of text per denoising step that finalised some."""
        engine, chat = self._chat(
            prompt, system_prompt, max_tokens=max_tokens, num_denoising_steps=num_denoising_steps,
            block_length=block_length, temperature=temperature, seed=seed, use_local_leap=use_local_leap,
            kv_cache=kv_cache, confidence_threshold=confidence_threshold,
        )  # fmt: skip
        try:
            async for text in native.stream_text(engine, chat):
                yield text
        except APIError as error:
            raise bentoml_error(error) from None

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
