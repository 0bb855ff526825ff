"""The BentoML service: loads the diffusion engine on startup and mounts the OpenAI-compatible app at "/".

Only what BentoML needs lives here: resources and traffic settings, startup and shutdown, readiness and
metrics. The HTTP layer is the `api` package (start at api/app.py); the engine is `engine`. torch is
imported lazily (in `load_engine`) so that `bentoml build`, which imports this file, stays cheap.

Configuration (environment): DLLM_MODEL (a local directory or hub id; default: the embedded
models/tiny-llada-chat), DLLM_DEVICE (default cuda when available), DLLM_DTYPE (default bfloat16 on CUDA,
float32 on CPU), DLLM_MAX_BATCH_SIZE / DLLM_MAX_WAITING / DLLM_MAX_WAIT_MS (the engine's scheduler),
DLLM_API_KEY (when set, /v1 requires `Authorization: Bearer <key>`), DLLM_COMPILE (1: torch.compile the
model's blocks), DLLM_MAX_REQUEST_BYTES (default 2 MiB), DLLM_LOG_LEVEL (default INFO).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import bentoml

from api.app import create_app
from api.middleware import install_response_start_timeout
from api.streaming import max_request_bytes

if TYPE_CHECKING:
    from engine import DiffusionEngine

logger = logging.getLogger("dllm_serve")

app = create_app()

# Before BentoML builds its middleware stack (when the service's app is created, after this import).
install_response_start_timeout()


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

        max_request_bytes()  # a bad DLLM_MAX_REQUEST_BYTES fails the start, not every request
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

    def __is_ready__(self) -> bool:
        return self.engine is not None

    def __metrics__(self, text: str) -> str:
        if self.engine is None:
            return text
        return text + self.engine.stats.prometheus_text()

    @bentoml.on_shutdown
    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
