"""The HTTP answers to the engine's states, with a real engine behind the in-process app: a full queue (429), a
request still queued when the engine stops (503 `shutting_down`), no engine loaded yet (503 `model_not_ready`).

The served engine is replaced by one on the same model with a queue of one or two (`max_batch_size` 1), whose
`step` waits for the test's permit (tests/step_gate.py). Everything else is the real path: `astream`, the
scheduler's queue bound and shutdown, `first_event` and the error mapping. "The slot is busy" then holds for as
long as the test says, with no timing involved.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine import DiffusionEngine, SamplingParams, SchedulerConfig
from tests.sse import sse_events
from tests.step_gate import HANG_GUARD_S, StepByStep

URL = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
BODY = {"messages": MESSAGES, "max_tokens": 8}


def wait_until(condition) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # only turns a hang into a failure
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)


@pytest.fixture
def serve_small_queue(service_instance, monkeypatch):
    """Serve the loaded model through an engine with one slot and `max_waiting` queue places, stepping on permits."""
    served: list[tuple[DiffusionEngine, StepByStep]] = []

    def serve(max_waiting: int) -> tuple[DiffusionEngine, StepByStep]:
        base = service_instance.engine
        config = SchedulerConfig(max_batch_size=1, max_waiting=max_waiting)
        engine = DiffusionEngine(base.model, base.tokenizer, base.device, base.model_name, config)
        steps = StepByStep(engine)
        monkeypatch.setattr(engine, "step", steps)
        monkeypatch.setattr(service_instance, "engine", engine)
        served.append((engine, steps))
        return engine, steps

    yield serve
    for engine, steps in served:
        steps.run_freely()  # a failed test must not leave a request held
        engine.shutdown()


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_is_a_429_through_the_real_engine(service_client, serve_small_queue, stream):
    engine, steps = serve_small_queue(max_waiting=0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        busy = pool.submit(service_client.post, URL, json=BODY)
        steps.wait_for_arrival(1)  # admitted: it holds the only slot, its first step waiting for a permit
        refused = service_client.post(URL, json={**BODY, "stream": stream}, headers={"X-Request-ID": "full-1"})
        steps.run_freely()
        served = busy.result(timeout=HANG_GUARD_S)

    assert refused.status_code == 429  # a plain JSON error, also for a stream: nothing had started
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "rate_limit_exceeded", None)
    assert refused.headers["Retry-After"] == "1" and refused.headers["X-Request-ID"] == "full-1"

    # The request in the slot is unharmed, and the refused one was never queued.
    assert served.status_code == 200
    alone = engine.generate(messages=MESSAGES, params=SamplingParams(gen_length=8))
    assert served.json()["choices"][0]["message"]["content"] == alone.text
    assert engine.stats.snapshot()["dllm_requests_total"] == 2  # the one served over HTTP, and `alone`
    assert service_client.post(URL, json=BODY).status_code == 200  # capacity is back


def test_a_request_still_waiting_at_shutdown_is_a_503(service_client, serve_small_queue):
    engine, steps = serve_small_queue(max_waiting=1)
    with ThreadPoolExecutor(max_workers=3) as pool:
        running = pool.submit(service_client.post, URL, json={**BODY, "stream": True})
        steps.wait_for_arrival(1)
        steps.permits.release()  # its first step runs (the stream starts); its second is held
        steps.wait_for_arrival(2)
        waiting = pool.submit(service_client.post, URL, json=BODY, headers={"X-Request-ID": "late-1"})
        wait_until(lambda: engine.stats.snapshot()["dllm_requests_waiting"] == 1)
        scheduler = engine._scheduler
        stopping = pool.submit(engine.shutdown)  # without drain: what is pending fails at once
        wait_until(lambda: scheduler._stopping)
        steps.run_freely()
        stopping.result(timeout=HANG_GUARD_S)
        refused, cut = waiting.result(timeout=HANG_GUARD_S), running.result(timeout=HANG_GUARD_S)

    assert refused.status_code == 503
    assert refused.json()["error"] | {"message": None} == {
        "message": None, "type": "server_error", "param": None, "code": "shutting_down"
    }  # fmt: skip
    assert refused.headers["X-Request-ID"] == "late-1"
    # The running stream had sent its first step: the failure can only travel inside the stream.
    assert cut.status_code == 200
    events = sse_events(cut.text)
    assert events[1]["diffusion"]["step"] == 0
    assert events[-2]["error"]["type"] == "server_error" and events[-1] == "[DONE]"


def test_before_the_model_is_loaded_v1_is_a_503_model_not_ready(service_client, service_instance, monkeypatch):
    monkeypatch.setattr(service_instance, "engine", None)  # what the app holds until `load_engine` has run
    for response in (
        service_client.post(URL, json=BODY, headers={"X-Request-ID": "early-1"}),
        service_client.post(URL, json={**BODY, "stream": True}, headers={"X-Request-ID": "early-1"}),
        service_client.get("/v1/models", headers={"X-Request-ID": "early-1"}),
    ):
        assert response.status_code == 503
        assert response.json()["error"] | {"message": None} == {
            "message": None, "type": "server_error", "param": None, "code": "model_not_ready"
        }  # fmt: skip
        assert response.headers["Retry-After"] == "5" and response.headers["X-Request-ID"] == "early-1"
    assert service_client.get("/readyz").status_code == 503  # load balancers keep traffic away meanwhile
    assert service_client.get("/livez").status_code == 200  # but the process is alive: do not restart it
