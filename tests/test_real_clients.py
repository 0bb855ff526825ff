"""Real clients, unmodified and with their default request shapes, against a real `bentoml serve`.

The libraries are the `clients` extra (installed by scripts/test.sh). Each test checks that text comes
back and has the client's own shape; none depends on what the model answers. Chat clients talk to the
embedded chat model; LlamaIndex's `OpenAILike` calls the legacy `/v1/completions` with a raw prompt,
which the embedded chat model answers with nothing, so it talks to the random-weight fixture model,
which always writes something.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.sse import named_sse_events

pytestmark = pytest.mark.slow

QUESTION = "Spell cat."
RAW_PROMPT = "Count from 3 to 6."  # the fixture model writes a full canvas of (meaningless) text for it


@pytest.fixture(scope="module")
def v1(bentoml_server) -> str:
    return f"{bentoml_server}/v1"


# --- the official SDK ---------------------------------------------------------------------------------


def test_openai_sync_async_and_stream(v1):
    from openai import AsyncOpenAI, OpenAI

    messages = [{"role": "user", "content": QUESTION}]
    reply = OpenAI(base_url=v1, api_key="any string").chat.completions.create(
        model="tiny-llada-chat", messages=messages
    )
    assert reply.choices[0].message.content and reply.choices[0].finish_reason in ("stop", "length")

    async def async_calls():
        client = AsyncOpenAI(base_url=v1, api_key="any string")
        whole = await client.chat.completions.create(model="m", messages=messages)
        stream = await client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        return whole, chunks

    whole, chunks = asyncio.run(async_calls())
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content == reply.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_legacy_completions(fixture_model_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{fixture_model_server}/v1", api_key="any string")
    whole = client.completions.create(model="m", prompt=RAW_PROMPT, max_tokens=16)
    assert whole.object == "text_completion" and whole.choices[0].text
    pieces = [
        c.choices[0].text
        for c in client.completions.create(model="m", prompt=RAW_PROMPT, max_tokens=16, stream=True)
        if c.choices
    ]
    assert "".join(pieces) == whole.choices[0].text


# --- LiteLLM ------------------------------------------------------------------------------------------


def test_litellm_completion_and_stream(v1):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list
    litellm = pytest.importorskip("litellm")

    messages = [{"role": "user", "content": QUESTION}]
    settings = {"model": "openai/tiny-llada-chat", "api_base": v1, "api_key": "any string"}
    reply = litellm.completion(messages=messages, **settings)
    text = reply.choices[0].message.content
    assert text
    streamed = "".join(
        chunk.choices[0].delta.content or "" for chunk in litellm.completion(messages=messages, stream=True, **settings)
    )
    assert streamed == text


# --- LangChain ----------------------------------------------------------------------------------------


def test_langchain_chat_openai_invoke_and_stream_with_usage(v1):
    langchain_openai = pytest.importorskip("langchain_openai")

    llm = langchain_openai.ChatOpenAI(model="tiny-llada-chat", base_url=v1, api_key="any string", stream_usage=True)
    answer = llm.invoke(QUESTION)
    assert answer.content and answer.usage_metadata["output_tokens"] >= 1
    chunks = list(llm.stream(QUESTION))
    assert "".join(chunk.content for chunk in chunks) == answer.content
    usage = [chunk.usage_metadata for chunk in chunks if chunk.usage_metadata]
    assert usage and usage[-1]["output_tokens"] == answer.usage_metadata["output_tokens"]


def test_langchain_legacy_openai_class_with_its_defaults(fixture_model_server):
    # It sends top_p: 1, frequency_penalty: 0, presence_penalty: 0, n: 1, logprobs: null, seed: null and
    # temperature 0.7 to /v1/completions: the neutral values (ADR 005's amendment) must pass.
    langchain_openai = pytest.importorskip("langchain_openai")

    llm = langchain_openai.OpenAI(model="llada-tiny", base_url=f"{fixture_model_server}/v1", api_key="any string")
    assert (llm.top_p, llm.frequency_penalty, llm.presence_penalty) == (1, 0, 0)  # the defaults this test is about
    text = llm.invoke(RAW_PROMPT)  # all defaults: max_tokens 256, temperature 0.7
    assert isinstance(text, str) and text
    pieces = list(llm.stream(RAW_PROMPT, max_tokens=16))
    assert pieces and all(isinstance(piece, str) for piece in pieces) and "".join(pieces)


# --- LlamaIndex ---------------------------------------------------------------------------------------


def test_llamaindex_openai_like_defaults_use_the_completions_endpoint(fixture_model_server):
    openai_like = pytest.importorskip("llama_index.llms.openai_like")

    llm = openai_like.OpenAILike(model="llada-tiny", api_base=f"{fixture_model_server}/v1", api_key="any string")
    assert not llm.is_chat_model  # its default: the legacy completions endpoint
    whole = llm.complete(RAW_PROMPT)
    assert whole.text and whole.raw.object == "text_completion"
    pieces = list(llm.stream_complete(RAW_PROMPT))
    # Its default temperature (0.1) samples, and each request draws its own seed: the texts may differ.
    assert "".join(piece.delta or "" for piece in pieces) == pieces[-1].text and pieces[-1].text


# --- BentoML's own clients (the native API) -----------------------------------------------------------


def test_bentoml_clients_call_the_native_api(bentoml_server):
    import bentoml

    with bentoml.SyncHTTPClient(bentoml_server) as client:
        text = client.generate(prompt=QUESTION, max_tokens=32)
        pieces = list(client.generate_stream(prompt=QUESTION, max_tokens=32))
        with pytest.raises(bentoml.exceptions.BentoMLException) as error:
            client.generate(prompt=QUESTION, num_denoising_steps=0)
    events = named_sse_events("".join(pieces))  # server-sent events (tests/test_native_api.py has the rest)
    assert text and "".join(data for name, data in events if name is None) == text
    assert "num_denoising_steps" in str(error.value)

    async def async_call():
        async with bentoml.AsyncHTTPClient(bentoml_server) as client:
            return await client.generate(prompt=QUESTION, max_tokens=32)

    assert asyncio.run(async_call()) == text
