"""Shared fixtures. Nothing here loads a model unless a test asks for the fixture.

`fixture_engine`, `dream_engine`, `llada2_engine` and `embedded_engine`: one engine on each checkpoint
(tests/fixtures/llada-tiny, dream-tiny, llada2-tiny, models/tiny-llada-chat) for the whole session.
Tests that change an engine's behaviour (its scheduler configuration, a wrapped `step`) build their own
`DiffusionEngine` around its model and tokenizer instead of patching this one.

Servers: `service_client` runs the BentoML service in-process (one per test session: BentoML's
`Service.to_asgi()` can be called only once per process); `bentoml_server` starts a real
`bentoml serve` in a subprocess and always stops it. Both serve `DLLM_MODEL` from the environment,
by default the embedded model (models/tiny-llada-chat); `fixture_model_server` is a second real server on
the random-weight fixture checkpoint.

Tiers (docs/testing.md): a test that starts a server (a real `bentoml serve`), a browser, a subprocess run or
a long generation is marked `slow`; `python -m pytest -m "not slow"` is the quick loop. A test that asks for a
server or browser fixture is marked here, whether or not its module says so.

Servers boot ahead: once the run's tests are known, one background thread starts, one after the other, every
`bentoml serve` they will ask for (the server fixtures' and those named by `server_env` marks), so that
booting overlaps the tests before them; `start_server` hands out such a server when its environment matches.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixture_paths import DREAM_FIXTURE_DIR, FIXTURE_DIR, REPO_ROOT

# Before anything imports torch (OpenMP reads these once), as server/engine_setup.py does for the server: the tiny
# models gain little from a second thread, and OpenMP's spinning workers stall every torch call of this process
# while the servers it starts (or other jobs) use the cores: the same tests took 3 to 5 times longer that way.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SERVER_START_TIMEOUT_S = 180
# The server fixtures and the environment each adds (start_server adds it to this process's environment).
SERVER_FIXTURES: dict[str, dict[str, str]] = {
    "bentoml_server": {},
    "fixture_model_server": {"DLLM_MODEL": str(FIXTURE_DIR)},
}
SLOW_FIXTURES = {*SERVER_FIXTURES, "browser"}  # `browser`: tests/test_playground.py's Chromium


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


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
def embedded_engine():
    """The embedded model (models/tiny-llada-chat), loaded the way a user does: `from_pretrained` with no path."""
    from engine import DiffusionEngine

    engine = DiffusionEngine.from_pretrained(device="cpu")
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
    """Start `bentoml serve` with the environment plus `env`; returns (process, base URL, log path). A server
    booted ahead with the same `env` (`early_servers`) is handed out instead, its log in its own workdir."""
    early = early_servers.take(env or {})
    return early if early is not None else _spawn_server(workdir, env)


def _spawn_server(workdir, env: dict[str, str] | None, base_env=None) -> tuple[subprocess.Popen, str, object]:
    port = _free_port()
    log_path = workdir / "serve.log"
    full_env = {
        **(os.environ if base_env is None else base_env),
        "BENTOML_HOME": str(workdir / "bentoml-home"),
        "BENTOML_DO_NOT_TRACK": "true",
    }
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
    process, base_url, log_path = start_server(workdir, env)
    try:
        if not _wait_until_ready(process, base_url, time.monotonic() + SERVER_START_TIMEOUT_S):
            if process.poll() is not None:
                pytest.fail(f"bentoml serve exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            pytest.fail(f"bentoml serve not ready in {SERVER_START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
        yield ServerProcess(base_url, process, log_path)
    finally:
        _stop_process_group(process)


def _wait_until_ready(process: subprocess.Popen, base_url: str, deadline: float, stop=None) -> bool:
    """True once GET /readyz is 200; False if the process exits, the deadline passes or `stop` is set."""
    import httpx

    while process.poll() is None and time.monotonic() < deadline and not (stop and stop.is_set()):
        try:
            if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


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


# --- servers booted ahead ---------------------------------------------------------------------------------


def _env_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(env.items()))


class EarlyServers:
    """`bentoml serve` processes booted in the background before the tests that use them, one at a time (a
    boot is mostly imports: one spare core is all it can use), in the order the tests will ask for them, and
    at most `AHEAD` not yet taken (an idle server holds about 0.5 GB).

    `take(env)` hands out a started one (booting or ready; `running_server` still waits for /readyz), or None:
    then the caller starts its own, and the one still queued for it is dropped. Whatever nobody took is
    stopped at the end of the session and named in its summary.
    """

    AHEAD = 2

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._queue: list[dict[str, str]] = []
        self._started: list[tuple[dict[str, str], tuple]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workdir: Path | None = None
        self.unused: list[dict[str, str]] = []

    def boot(self, envs: list[dict[str, str]]) -> None:
        if not envs:
            return
        self._queue = list(envs)
        # This process's environment now, before any test runs: a test's monkeypatched variable (e.g. a
        # scheduler setting) must not leak into a server that happens to boot during that test.
        self._base_env = dict(os.environ)
        self._workdir = Path(tempfile.mkdtemp(prefix="dllm-serve-early-"))
        self._thread = threading.Thread(target=self._boot_all, name="early-servers", daemon=True)
        self._thread.start()

    def _boot_all(self) -> None:
        for index in itertools.count():
            with self._lock:
                self._lock.wait_for(lambda: len(self._started) < self.AHEAD or self._stop.is_set())
                if self._stop.is_set() or not self._queue:
                    return
                env = self._queue.pop(0)
                workdir = self._workdir / f"server-{index}"
                workdir.mkdir()
                started = _spawn_server(workdir, env, self._base_env)
                self._started.append((env, started))
            process, base_url, _ = started
            _wait_until_ready(process, base_url, time.monotonic() + SERVER_START_TIMEOUT_S, self._stop)

    def take(self, env: dict[str, str]) -> tuple | None:
        key = _env_key(env)
        with self._lock:
            for i, (started_env, started) in enumerate(self._started):
                if _env_key(started_env) == key:
                    del self._started[i]
                    self._lock.notify_all()
                    return started
            for i, queued in enumerate(self._queue):
                if _env_key(queued) == key:
                    del self._queue[i]  # the caller starts it now: booting it again later would be waste
                    break
        return None

    def stop_all(self) -> None:
        with self._lock:  # the boot thread starts nothing after this
            self._stop.set()
            leftovers, self._started = self._started, []
            self._queue = []
            self._lock.notify_all()
        for env, (process, _, _) in leftovers:
            _stop_process_group(process)
            self.unused.append(env)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


early_servers = EarlyServers()


def servers_to_boot(items) -> list[dict[str, str]]:
    """The environments of the servers `items` will start, in the order they first need them: each server
    fixture once, and one per node (a module, a test) that carries a `server_env(env)` mark; with
    `fixture=name`, only if one of the node's tests asks for that fixture (the one that starts the server)."""
    envs, seen = [], set()
    for item in items:
        for name, env in SERVER_FIXTURES.items():
            if name in item.fixturenames and name not in seen:
                seen.add(name)
                envs.append(env)
        for node, mark in item.iter_markers_with_node("server_env"):
            key = (node.nodeid, _env_key(mark.args[0]))
            fixture = mark.kwargs.get("fixture")
            if key not in seen and (fixture is None or fixture in item.fixturenames):
                seen.add(key)
                envs.append(dict(mark.args[0]))
    return envs


def pytest_collection_finish(session) -> None:
    if not session.config.option.collectonly:
        early_servers.boot(servers_to_boot(session.items))


def pytest_sessionfinish(session) -> None:
    early_servers.stop_all()


def pytest_terminal_summary(terminalreporter) -> None:
    for env in early_servers.unused:  # a test skipped, or a `server_env` mark out of step with its test
        terminalreporter.write_line(f"conftest: a server booted ahead was never used: env {env}")
