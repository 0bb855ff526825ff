"""Shared fixtures. Nothing here loads a model unless a test asks for the fixture.

`fixture_engine`, `dream_engine` and `llada2_engine`: one engine on each fixture checkpoint
(tests/fixtures/llada-tiny, dream-tiny, llada2-tiny) for the whole session.
Tests that change an engine's behaviour (its scheduler configuration, a wrapped `step`) build their own
`DiffusionEngine` around its model and tokenizer instead of patching this one.

Servers: `service_client` runs the BentoML service in-process (one per test session: BentoML's
`Service.to_asgi()` can be called only once per process); `bentoml_server` starts a real
`bentoml serve` in a subprocess and always stops it. Both serve `DLLM_MODEL` from the environment,
by default the embedded model (models/tiny-llada-chat); `fixture_model_server` is a second real server on
the random-weight fixture checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.fixture_paths import DREAM_FIXTURE_DIR, FIXTURE_DIR, REPO_ROOT

SERVER_START_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def fixture_engine():
    from engine import DiffusionEngine

    engine = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def dream_engine():
    from engine import DiffusionEngine

    engine = DiffusionEngine.from_pretrained(DREAM_FIXTURE_DIR, device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def llada2_engine():
    """An engine on tests/fixtures/llada2-tiny (token-id prompts: see tests/llada2_engine.py)."""
    from tests.llada2_engine import llada2_engine as build

    engine = build()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def service_client() -> Iterator:
    """A starlette TestClient of the whole BentoML app (BentoML routes, the mounted FastAPI app), with its
    lifespan running, so the engine is loaded."""
    from starlette.testclient import TestClient

    from service import DiffusionLLMService

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("DLLM_API_KEY", raising=False)  # tests that need a key set it themselves
        with TestClient(DiffusionLLMService.to_asgi(), base_url="http://testserver") as client:
            yield client


@pytest.fixture
def configure_app(service_client) -> Iterator[Callable[..., None]]:
    """`configure_app(**changes)`: the in-process app's settings (api/settings.py: the request size limit, the
    API key) as the service started with them, with these changes, until the test ends. The service reads
    them from the environment once, at startup, so a test cannot change them through the environment."""
    import dataclasses

    import service

    started_with = service.app.state.settings

    def configure(**changes) -> None:
        service.app.state.settings = dataclasses.replace(started_with, **changes)

    yield configure
    service.app.state.settings = started_with


@pytest.fixture(scope="session")
def service_instance(service_client):
    """The running service object (its `.engine`), for tests that stub engine behaviour."""
    import bentoml

    return bentoml.get_current_service()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def bentoml_server(tmp_path_factory) -> Iterator[str]:
    """Base URL of a real `bentoml serve service:DiffusionLLMService`, ready (GET /readyz is 200)."""
    with running_server(tmp_path_factory.mktemp("bentoml-serve")) as server:
        yield server.base_url


@pytest.fixture(scope="session")
def fixture_model_server(tmp_path_factory) -> Iterator[str]:
    """Like `bentoml_server`, serving the random-weight fixture checkpoint (tests/fixtures/llada-tiny): it
    writes (meaningless) text for a raw prompt, where the embedded chat model answers only chat prompts."""
    workdir = tmp_path_factory.mktemp("bentoml-serve-fixture")
    with running_server(workdir, {"DLLM_MODEL": str(FIXTURE_DIR)}) as server:
        yield server.base_url


class ServerProcess:
    """A `bentoml serve` subprocess: its base URL, its process (the arbiter) and its log file."""

    def __init__(self, base_url: str, process: subprocess.Popen, log_path):
        self.base_url = base_url
        self.process = process
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pid(self) -> int:
        """The pid of BentoML's one worker (the process that serves)."""
        import psutil

        children = psutil.Process(self.process.pid).children(recursive=True)
        return next(c.pid for c in children if "_bentoml_impl.worker" in " ".join(c.cmdline()))


def start_server(workdir, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, object]:
    """Start `bentoml serve` with the environment plus `env`; returns (process, base URL, log path)."""
    port = _free_port()
    log_path = workdir / "serve.log"
    full_env = {**os.environ, "BENTOML_HOME": str(workdir / "bentoml-home"), "BENTOML_DO_NOT_TRACK": "true"}
    full_env.pop("DLLM_API_KEY", None)
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bentoml", "serve", "service:DiffusionLLMService", "--host", "127.0.0.1"]
            + ["--port", str(port)],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the finalizer stops BentoML's workers too
        )
    return process, f"http://127.0.0.1:{port}", log_path


@contextlib.contextmanager
def running_server(workdir, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A ready `bentoml serve` (GET /readyz is 200), always stopped at the end, even if a test stopped it."""
    import httpx

    process, base_url, log_path = start_server(workdir, env)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"bentoml serve exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"bentoml serve not ready in {SERVER_START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield ServerProcess(base_url, process, log_path)
    finally:
        _stop_process_group(process)


def _stop_process_group(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        try:  # its worker may have outlived it
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:  # whatever is left of the group (a worker that outlived its arbiter)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=10)
