"""The BentoML service: loads the diffusion engine on startup and mounts the OpenAI-compatible app at "/".

Only what BentoML needs lives here: resources and traffic, startup and shutdown, readiness and metrics, the
middleware around the app, and BentoML's own API (`generate`, `generate_stream`: thin wrappers of
server/native.py, which also says how their answers and errors look). The app is the `api` package (start at
api/app.py); what adapts it to BentoML and uvicorn is the `server` package; the engine is `engine`. Nothing
here imports torch, so that `bentoml build`, which imports this file, stays cheap. An invalid setting
(docs/deploy.md) stops `bentoml serve` before any worker starts, where BentoML would restart the worker
forever: the HTTP settings as `bentoml serve` imports this module (read once, here), the engine's in
`check_configuration`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import bentoml
from starlette.middleware.cors import CORSMiddleware

from api.app import create_app
from server import engine_setup, native
from server.connections import connection_stats, install_connection_guard
from server.drain import Drain
from server.index_page import SERVICE_DESCRIPTION, DescribedService, add_bentoml_explorer
from server.logs import configure_logging
from server.metrics_labels import EndpointLabels, install_route_labels
from server.middleware import RequestGuard, install_response_start_timeout
from server.settings import ServerSettings

if TYPE_CHECKING:
    from engine import DiffusionEngine

# How long stopping the engine waits for its scheduler thread (on the event loop: SIGTERM's exit stays bounded).
ENGINE_STOP_WAIT_S = 1.0

try:
    settings = ServerSettings.from_env()
except ValueError as error:
    raise SystemExit(f"dllm-serve: invalid configuration: {error}") from None
drain = Drain(settings.shutdown_grace_s)
app = create_app(settings.api)
add_bentoml_explorer(app)  # BentoML's own page, moved from / (now the app's landing page) to /bentoml

# Before BentoML builds its middleware stack (when the service's app is created, after this import) and
# before uvicorn loads its config (after that).
install_response_start_timeout()
install_connection_guard(settings)


# The arguments of both methods of BentoML's own API (their descriptions: server/native.py), written once.
# Named and based as the model BentoML derives from a method's signature, and without a docstring (it would
# become the schema's description), so that BentoML's schema and its errors read as before.
class Input(bentoml.IODescriptor):
    prompt: native.Prompt
    system_prompt: native.SystemPrompt = None
    max_tokens: native.MaxTokens = None
    num_denoising_steps: native.Steps = None
    block_length: native.BlockLength = None
    temperature: native.Temperature = None
    seed: native.Seed = None
    use_local_leap: native.LocalLeap = None
    kv_cache: native.KVCache = None
    confidence_threshold: native.Threshold = None
    editing_threshold: native.EditingThreshold = None


@bentoml.asgi_app(app, path="/")
@bentoml.service(
    name="dllm-serve",
    description=SERVICE_DESCRIPTION,
    service_class=DescribedService,
    # One process owns the model and batches inside it; scale out with replicas, not workers.
    workers=1,
    # The timeout ends at the response headers (server.middleware.ResponseStartTimeout): a long non-stream
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
        """In the `bentoml serve` process, before any worker starts: the engine's settings (server/engine_setup.py)."""
        engine_setup.check_in_child_process()

    @bentoml.on_startup
    def load_engine(self) -> None:
        configure_logging()
        self.engine = engine_setup.load_from_env()
        # On the serving loop's thread: SIGTERM now drains before uvicorn's own handler runs (server/drain.py).
        drain.intercept_signals(asyncio.get_running_loop(), on_grace_expired=self.stop_engine)

    def __is_ready__(self) -> bool:
        return self.engine is not None and self.engine.ready and not drain.draining

    def __metrics__(self, text: str) -> str:
        engine_text = self.engine.stats.prometheus_text() if self.engine is not None else ""
        return text + connection_stats.prometheus_text() + engine_text

    # --- BentoML's own API (the OpenAI-compatible one is the mounted app): the same arguments, two results ---

    @bentoml.api(input_spec=Input)
    async def generate(self, ctx: bentoml.Context, **arguments: Any) -> str:
        """The answer to one user message, generated by diffusion."""
        return await native.generate_text(self.engine, ctx, **arguments)

    @bentoml.api(input_spec=Input)
    async def generate_stream(self, ctx: bentoml.Context, **arguments: Any) -> AsyncGenerator[str, None]:
        """The answer as server-sent events: `data:` each piece of text as it becomes final (one per denoising
        step that finalised some), then `event: done` with the finish reason (`event: error` on a failure)."""
        async for event in native.stream_text(self.engine, ctx, **arguments):
            yield event

    @bentoml.on_shutdown
    def stop_engine(self) -> None:
        # Pending requests are failed at once; the scheduler thread gets a moment to end, not the rest of a
        # forward that may run for minutes (it is a daemon thread: the process exits without it).
        if self.engine is not None:
            self.engine.shutdown(timeout=ENGINE_STOP_WAIT_S)


# Around the whole app, BentoML's routes included; the first added is the outermost. CORS first, so that
# every answer a browser page gets (the guard's 503s and 415s too) carries its headers.
if settings.cors_origins:
    DiffusionLLMService.add_asgi_middleware(CORSMiddleware, **settings.cors_options())
# The routes of BentoML's own API run the engine: they take the API key, and answer in the server's envelope.
native_routes = frozenset(method.route for method in DiffusionLLMService.apis.values())
DiffusionLLMService.add_asgi_middleware(RequestGuard, drain=drain, settings=settings, native_routes=native_routes)
# BentoML's request metrics are labelled by the route that served them, not by the path a client sent.
install_route_labels(EndpointLabels(app.routes, own_paths=native_routes))
