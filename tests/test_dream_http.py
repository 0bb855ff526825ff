"""A Dream model behind the same HTTP API: the in-process BentoML app (`service_client`) serving a Dream engine,
its own sampler defaults reported in `diffusion`, the new request values, and streaming."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.fixture_paths import dream_reference, fast_dllm_dream_reference
from tests.sse import sse_events

URL = "/v1/chat/completions"
MESSAGES = dream_reference()["prompts"][0]["messages"]


@pytest.fixture
def dream_client(service_client, service_instance, dream_engine, monkeypatch):
    """The service's client, with the service serving the Dream engine for this test."""
    monkeypatch.setattr(service_instance, "engine", dream_engine)
    return service_client


def test_dream_completion_reports_dream_defaults_and_matches_the_engine(dream_client, dream_engine):
    response = dream_client.post(URL, json={"messages": MESSAGES, "max_tokens": 16, "num_denoising_steps": 8})
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["model"] == "dream-tiny"
    diffusion = completion["diffusion"]
    assert (diffusion["block_schedule"], diffusion["confidence_metric"]) == ("dream", "entropy_inverse")
    expected = dream_engine.generate(messages=MESSAGES, params=SamplingParams(gen_length=16, num_denoising_steps=8))
    assert completion["choices"][0]["message"]["content"] == expected.text
    assert diffusion["num_forward_passes"] == expected.num_forward_passes
    assert dream_client.get("/v1/models").json()["data"][0]["id"] == "dream-tiny"


def test_dream_stream_reassembles_the_completion_with_the_margin_metric(dream_client):
    body = {"messages": MESSAGES, "max_tokens": 16, "confidence_metric": "margin", "block_schedule": "uniform"}
    whole = dream_client.post(URL, json=body).json()
    *events, done = sse_events(dream_client.post(URL, json={**body, "stream": True}).text)
    assert done == "[DONE]"
    steps = [e for e in events if "step" in e.get("diffusion", {})]
    assert "".join(e["choices"][0]["delta"]["content"] for e in steps) == whole["choices"][0]["message"]["content"]
    (finish,) = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert (finish["diffusion"]["block_schedule"], finish["diffusion"]["confidence_metric"]) == ("uniform", "margin")
    committed = [c["token_id"] for e in steps for c in e["diffusion"]["committed"]]
    assert 679 not in committed and len(committed) == 16  # every canvas position once, never the mask


def test_dream_values_are_rejected_with_the_allowed_list(dream_client):
    response = dream_client.post(URL, json={"messages": MESSAGES, "block_schedule": "dreamy"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "block_schedule" and "'dream'" in error["message"]


# --- the approximate KV cache (Fast-dLLM) on Dream: the official runs of tests/fixtures/fast-dllm-dream ----------


def fast_dllm_case(case_id: str) -> dict:
    return next(c for c in fast_dllm_dream_reference()["cases"] if c["id"] == case_id)


def test_a_cached_dream_chat_completion_is_the_official_fast_dllm_run(dream_client, dream_engine):
    case = fast_dllm_case("prefix-g32-b8-s32-quota-chat0")  # a chat prompt of the dream-tiny fixture
    messages = dream_reference()["prompts"][0]["messages"]
    assert dream_engine.tokenizer.encode_chat(messages) == case["prompt_ids"]
    body = {"messages": messages, "max_tokens": 32, "block_length": 8, "num_denoising_steps": 32, "kv_cache": "prefix"}
    response = dream_client.post(URL, json=body)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert (case["first_eos_index"], case["first_im_end_index"]) == (None, None)  # the whole canvas is the answer
    assert completion["choices"][0]["message"]["content"] == dream_engine.tokenizer.decode(case["output_ids"])
    diffusion = completion["diffusion"]
    assert (diffusion["kv_cache"], diffusion["block_schedule"]) == ("prefix", "dream")
    assert diffusion["num_forward_passes"] == case["nfe"]


def test_a_cached_dream_stream_commits_what_each_official_forward_committed(dream_client):
    case = fast_dllm_case("dual-g32-b8-s4-thr0.9-rand4")  # threshold decoding, several tokens in one forward
    assert (case["first_eos_index"], case["first_im_end_index"]) == (None, None)  # no early exit to shorten it
    body = {"prompt": case["prompt_ids"], "max_tokens": 32, "block_length": 8, "kv_cache": "dual",
            "confidence_threshold": 0.9, "confidence_metric": "top1_prob", "stream": True}  # fmt: skip
    *events, done = sse_events(dream_client.post("/v1/completions", json=body).text)
    assert done == "[DONE]"
    steps = [e["diffusion"] for e in events if "step" in e.get("diffusion", {})]
    assert [sorted(c["position"] for c in step["committed"]) for step in steps] == case["step_commits"]
    by_position = {c["position"]: c["token_id"] for step in steps for c in step["committed"]}
    assert [by_position[o] for o in range(32)] == case["output_ids"]


def test_dream_refuses_a_cache_beside_a_threshold_step_count_naming_the_field(dream_client):
    body = {"messages": MESSAGES, "max_tokens": 32, "block_length": 8, "kv_cache": "dual",
            "confidence_threshold": 0.9, "num_denoising_steps": 8}  # fmt: skip
    response = dream_client.post(URL, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "num_denoising_steps"
