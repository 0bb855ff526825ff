"""A Dream model behind the same HTTP API: the in-process BentoML app (`service_client`) serving a Dream engine,
its own sampler defaults reported in `diffusion`, the new request values, and streaming."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.fixture_paths import dream_reference
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
