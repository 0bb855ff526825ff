"""The HTTP API on a LLaDA2 checkpoint (tests/fixtures/llada2-chat-tiny): the family's defaults, both endpoints
whole and streamed, token editing on the wire, the knobs it refuses, /v1/models; then once on a real
`bentoml serve` through the openai SDK.

The fixture's weights are random: EOS never wins, so every answer runs to max_tokens, and the tests compare
the stream with the whole response of the same (deterministic, temperature 0) request rather than text.
"""

from __future__ import annotations

import pytest

from tests.fixture_paths import LLADA2_CHAT_FIXTURE_DIR
from tests.sse import sse_events

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def llada2_chat_engine():
    from engine import DiffusionEngine

    engine = DiffusionEngine.from_pretrained(LLADA2_CHAT_FIXTURE_DIR, device="cpu")
    yield engine
    engine.shutdown()


def _client(engine):
    from starlette.testclient import TestClient

    from api.app import create_app
    from api.settings import ApiSettings

    app = create_app(ApiSettings())
    app.state.engine = engine
    return TestClient(app)


@pytest.fixture(scope="module")
def client(llada2_chat_engine):
    return _client(llada2_chat_engine)


def chat(client, **body):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert response.status_code == 200, response.text
    return response.json()


def chat_stream(client, **body):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True, **body})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    return events[:-1]


def step_chunks(chunks):
    return [c for c in chunks if "diffusion" in c and "step" in c["diffusion"]]


def test_a_request_that_names_no_settings_runs_the_authors_sampler(client, llada2_chat_engine):
    body = chat(client, max_tokens=40)
    resolved = body["diffusion"]
    # LLaDA2.0's threshold decoding with blocks of 32 (engine/config.py, LLaDA2Config.sampler_defaults).
    assert resolved["block_length"] == 32 and resolved["confidence_threshold"] == 0.95
    assert resolved["num_blocks"] == 2  # ceil(40 / 32): the answer's blocks
    assert resolved["num_denoising_steps"] is None and resolved["editing_threshold"] is None
    assert resolved["block_schedule"] == "uniform" and resolved["confidence_metric"] == "top1_prob"
    # 40 is not a multiple of 32: the canvas is rounded up to whole blocks and 40 tokens come back.
    assert body["usage"]["completion_tokens"] == 40
    assert body["choices"][0]["finish_reason"] == "length"
    assert llada2_chat_engine.tokenizer.encode_prompt(body["choices"][0]["message"]["content"])  # some text


def test_a_short_canvas_inside_one_block_works(client):
    body = chat(client, max_tokens=5)
    assert body["usage"]["completion_tokens"] == 5 and body["diffusion"]["block_length"] == 32


def test_settings_sent_are_the_settings_run(client):
    # LLaDA2.1's speed mode, as its model card gives it.
    resolved = chat(client, max_tokens=32, confidence_threshold=0.5, editing_threshold=0.0)["diffusion"]
    assert (resolved["confidence_threshold"], resolved["editing_threshold"]) == (0.5, 0.0)
    assert (resolved["max_post_steps"], resolved["min_tokens_per_step"]) == (16, 1)
    # editing_threshold alone selects LLaDA2.1's sampler at its quality-mode threshold.
    resolved = chat(client, max_tokens=32, editing_threshold=0.5)["diffusion"]
    assert (resolved["confidence_threshold"], resolved["editing_threshold"]) == (0.7, 0.5)
    resolved = chat(client, max_tokens=64, block_length=16, num_denoising_steps=16)["diffusion"]
    assert (resolved["block_length"], resolved["num_denoising_steps"]) == (16, 16)


@pytest.mark.parametrize("editing", [None, 0.0], ids=["llada2.0", "llada2.1-editing"])
def test_the_stream_concatenates_to_the_whole_response(client, editing):
    settings = {"max_tokens": 70, "seed": 1} | ({"editing_threshold": editing} if editing is not None else {})
    whole = chat(client, **settings)
    chunks = chat_stream(client, **settings)
    steps = step_chunks(chunks)
    finish = chunks[-1]
    assert finish["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert finish["diffusion"] == whole["diffusion"]
    assert len(steps) == whole["diffusion"]["num_forward_passes"]
    assert [s["diffusion"]["step"] for s in steps] == list(range(len(steps)))
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == whole["choices"][0]["message"]["content"]
    edited = [e for s in steps for e in s["diffusion"]["edited"]]
    if editing is None:
        assert edited == []
    else:
        assert edited, "editing_threshold 0 overwrites some written token on random weights"
        assert all({"position", "token_id", "text"} == set(e) for e in edited)


def test_with_editing_text_is_streamed_when_its_block_closes(client):
    """A delta never holds a position of a block still being denoised: that position could yet be edited. So
    text comes only with a step that closed its block (the next step is in a later block) or the last one."""
    steps = step_chunks(chat_stream(client, max_tokens=70, editing_threshold=0.0))
    with_text = [i for i, s in enumerate(steps) if s["choices"][0]["delta"].get("content")]
    assert with_text, "some text is streamed before the end"
    for i in with_text[:-1] if with_text[-1] == len(steps) - 1 else with_text:
        assert steps[i + 1]["diffusion"]["block"] > steps[i]["diffusion"]["block"], steps[i]["diffusion"]


def test_completions_whole_and_streamed(client):
    body = {"prompt": "Once upon a time", "max_tokens": 33, "editing_threshold": 0.0}
    whole = client.post("/v1/completions", json=body)
    assert whole.status_code == 200, whole.text
    whole = whole.json()
    assert whole["usage"]["completion_tokens"] == 33 and whole["diffusion"]["editing_threshold"] == 0.0
    stream = client.post("/v1/completions", json=body | {"stream": True})
    chunks = sse_events(stream.text)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["choices"][0]["text"]
    assert len(step_chunks(chunks)) == whole["diffusion"]["num_forward_passes"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kv_cache", "prefix"),
        ("use_local_leap", True),
        ("block_schedule", "cosine"),
        ("confidence_metric", "entropy_inverse"),
    ],
)
def test_knobs_that_do_not_apply_are_refused_naming_the_field(client, field, value):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, field: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_a_step_count_with_editing_is_refused(client):
    response = client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "editing_threshold": 0.5, "num_denoising_steps": 32}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "num_denoising_steps"


def test_llada2_knobs_are_refused_on_llada(fixture_engine):
    client = _client(fixture_engine)
    for field, value in [("editing_threshold", 0.5), ("editing_threshold", 1.0)]:
        response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8, field: value})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == field
    # LLaDA keeps its own defaults: one block of the whole canvas, no threshold, steps = gen_length.
    body = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8}).json()
    assert (body["diffusion"]["block_length"], body["diffusion"]["num_denoising_steps"]) == (8, 8)
    assert body["diffusion"]["confidence_threshold"] is None
    stream = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8, "stream": True})
    assert all(s["diffusion"]["edited"] == [] for s in step_chunks(sse_events(stream.text)[:-1]))
    assert client.get("/v1/models").json()["data"][0]["family"] == "llada"


def test_models_says_the_family(client):
    card = client.get("/v1/models").json()["data"][0]
    assert card["family"] == "llada2" and card["id"] == "llada2-chat-tiny"


def test_a_real_server_streams_through_the_openai_sdk(tmp_path):
    """`DLLM_MODEL=<a LLaDA2 checkpoint> bentoml serve`, and the openai SDK as the client."""
    import httpx
    from openai import OpenAI

    from tests.conftest import running_server

    with running_server(tmp_path, {"DLLM_MODEL": str(LLADA2_CHAT_FIXTURE_DIR)}) as server:
        sdk = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        assert [m.family for m in sdk.models.list().data] == ["llada2"]
        extra = {"editing_threshold": 0.0}
        whole = sdk.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, extra_body=extra)
        stream = sdk.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, stream=True, extra_body=extra)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        steps = [c for c in chunks if c.model_extra.get("diffusion", {}).get("step") is not None]
        assert len(steps) == whole.model_extra["diffusion"]["num_forward_passes"]
        assert any(s.model_extra["diffusion"]["edited"] for s in steps)
        # BentoML's own API takes the same knobs, with the family's defaults and refusals.
        native = httpx.post(
            f"{server.base_url}/generate",
            json={"prompt": MESSAGES[0]["content"], "max_tokens": 40, **extra},
            timeout=120,
        )
        assert native.status_code == 200 and native.text == whole.choices[0].message.content
        refused = httpx.post(f"{server.base_url}/generate", json={"prompt": "Hi", "kv_cache": "dual"}, timeout=120)
        assert refused.status_code == 400 and "kv_cache" in refused.text
