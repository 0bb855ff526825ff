"""GET /playground: the page, its settings endpoint, and the page itself driven in headless Chromium.

The browser tests run the real page against a real `bentoml serve` (the `bentoml_server` fixture) and compare
what it shows with the API's own answers: the final text with a non-streamed call, each cell's step with a
streamed one, each error with the API's message. They use the OS's Chromium through Playwright and are
skipped, saying so, only where no Chromium binary exists (`bash scripts/test.sh` installs it as root on Debian).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

import engine.params as engine_params
from api.playground import ASSETS, CONTENT_SECURITY_POLICY, STATIC_DIR
from api.playground_settings import CONTROL_GROUPS, page_settings, resolved_defaults
from schemas.chat import ChatCompletionRequest
from scripts.playground_screenshot import find_chromium, launch_chromium

FINISHED = "[data-testid=status][data-state=done], [data-testid=status][data-state=error]"
PROMPT = "Count from 3 to 6."

# --- the page and its settings, in-process ---------------------------------------------------------------


def test_the_page_loads_nothing_from_elsewhere(service_client):
    response = service_client.get("/playground")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "connect-src 'self'" in CONTENT_SECURITY_POLICY

    # Every asset the page names is this server's, and is served.
    linked = re.findall(r'(?:src|href)="([^"]*)"', response.text)
    assert {"/playground/playground.js", "/playground/playground.css"} <= set(linked)
    for url in linked:
        assert url.startswith("/") and not url.startswith("//") or url.startswith("data:"), url
    for name, media_type in ASSETS.items():
        asset = service_client.get(f"/playground/{name}")
        assert asset.status_code == 200, name
        assert asset.headers["content-type"] == media_type
    for path in STATIC_DIR.iterdir():
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", path.read_text()), f"{path.name} names a host"


def test_unknown_playground_paths_get_the_api_error_envelope(service_client):
    for path in ("/playground/nope.js", "/playground/index.html", "/playground/settings"):
        response = service_client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found", path


def test_the_form_comes_from_the_request_schema_and_the_engine(service_client, service_instance):
    settings = service_client.get("/playground/settings.json").json()
    engine = service_instance.engine
    assert settings["model"] == engine.model_name and settings["family"] == engine.family == "llada"
    assert settings["stop_tokens"] == [
        {"token_id": i, "text": engine.tokenizer.token_text(i)} for i in sorted(engine.tokenizer.stop_ids)
    ]
    controls = {c["name"]: c for group in settings["groups"] for c in group["controls"]}
    assert [g["title"] for g in settings["groups"]] == [title for title, _ in CONTROL_GROUPS]
    assert set(controls) <= set(ChatCompletionRequest.model_fields)

    # Ranges and choices: the schema's (the engine's constants, which the schema mirrors).
    assert controls["num_denoising_steps"]["minimum"] == 1
    assert controls["num_denoising_steps"]["maximum"] == engine_params.MAX_STEPS
    assert controls["local_leap_radius"]["maximum"] == engine_params.MAX_LOCAL_LEAP_RADIUS
    assert controls["temperature"]["maximum"] == engine_params.MAX_TEMPERATURE
    assert controls["confidence_threshold"]["exclusiveMinimum"] == 0
    assert controls["block_schedule"]["enum"] == list(engine_params.BLOCK_SCHEDULES)
    assert controls["confidence_metric"]["enum"] == list(engine_params.CONFIDENCE_METRICS)
    assert controls["kv_cache"]["enum"] == list(engine_params.KV_CACHE_MODES)
    assert controls["max_tokens"]["maximum"] == engine.max_sequence_length
    assert {c["type"] for c in controls.values()} == {"integer", "number", "enum", "boolean"}

    # Defaults: what the engine resolves for a request that names nothing.
    assert controls["max_tokens"]["default"] == engine_params.DEFAULT_GEN_LENGTH
    assert controls["block_schedule"]["default"] == "uniform"
    assert controls["confidence_metric"]["default"] == "top1_prob"
    assert controls["kv_cache"]["default"] == "none"
    assert controls["temperature"]["default"] == 0
    for name, default in engine_params.LOCAL_LEAP_DEFAULTS.items():
        assert controls[name]["default"] == default
        assert controls[name]["requires"] == "use_local_leap"
    for name in ("block_length", "num_denoising_steps", "seed", "confidence_threshold"):
        assert controls[name]["default"] is None and controls[name]["default_note"], name


def test_the_defaults_follow_the_model_family(dream_engine):
    defaults = resolved_defaults(dream_engine)
    assert (defaults["block_schedule"], defaults["confidence_metric"]) == ("dream", "entropy_inverse")
    assert set(defaults) == {name for _, names in CONTROL_GROUPS for name in names}


def test_the_form_offers_the_knobs_of_the_loaded_family(service_client):
    from engine import DiffusionEngine
    from tests.fixture_paths import LLADA2_CHAT_FIXTURE_DIR

    def offered(settings) -> dict:
        return {c["name"]: c for group in settings["groups"] for c in group["controls"]}

    llada = service_client.get("/playground/settings.json").json()
    assert llada["aligned_blocks"] is False
    assert not {"editing_threshold", "max_post_steps", "min_tokens_per_step"} & set(offered(llada))

    llada2 = DiffusionEngine.from_pretrained(LLADA2_CHAT_FIXTURE_DIR, device="cpu")
    try:
        settings = page_settings(llada2)
    finally:
        llada2.shutdown()
    controls = offered(settings)
    assert settings["family"] == "llada2" and settings["aligned_blocks"] is True
    # What block diffusion refuses is not offered; token editing is, its two settings behind editing_threshold.
    assert not {"kv_cache", "block_schedule", "confidence_metric", "use_local_leap", "local_leap_radius"} & set(
        controls
    )
    assert controls["max_post_steps"]["requires"] == controls["min_tokens_per_step"]["requires"] == "editing_threshold"
    assert (controls["max_post_steps"]["default"], controls["min_tokens_per_step"]["default"]) == (16, 1)
    assert controls["block_length"]["default"] == 32
    assert (
        controls["confidence_threshold"]["default"] is None
        and "0.95" in controls["confidence_threshold"]["default_note"]
    )


# --- the page in a browser, against `bentoml serve` -------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium binary on this machine (install the OS package `chromium`)")

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright, executable)
        yield browser
        browser.close()


@pytest.fixture
def playground(browser, bentoml_server):
    """A fresh page on /playground, its form built. `.requests` lists what it asked for; `.errors` its script
    errors and console errors, where Chromium also reports what the Content-Security-Policy refused (a request
    to another host never starts, so it is not in `.requests`)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.requests, page.errors = [], []
    page.on("request", lambda request: page.requests.append(request))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("console", lambda message: message.type == "error" and page.errors.append(message.text))
    page.goto(f"{bentoml_server}/playground")
    page.get_by_test_id("max_tokens").wait_for()
    yield page
    context.close()


def send(page, prompt: str, **fields) -> None:
    for name, value in fields.items():
        page.get_by_test_id(name).fill(str(value))
    page.get_by_test_id("prompt").fill(prompt)
    page.get_by_test_id("send").click()
    page.wait_for_selector(FINISHED, timeout=60_000)


def chat_requests(page) -> list[dict]:
    return [json.loads(r.post_data) for r in page.requests if r.url.endswith("/v1/chat/completions")]


def cells(page) -> list[dict]:
    return page.evaluate(
        """() => [...document.querySelectorAll('[data-testid=canvas] [data-testid=cell]')].map(cell => ({
            state: cell.dataset.state,
            step: cell.dataset.step === undefined ? null : Number(cell.dataset.step),
            token_id: cell.dataset.tokenId === undefined ? null : Number(cell.dataset.tokenId),
            eos: cell.classList.contains('eos'),
            tail: cell.classList.contains('tail'),
        }))"""
    )


def stream_steps(base_url: str, body: dict) -> list[dict]:
    """The step chunks' `diffusion` objects of a streamed call."""
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    return [c["diffusion"] for c in chunks if "step" in c.get("diffusion", {})]


def watch_the_canvas(page) -> None:
    """Record, at every point the page's DOM settles, how many cells are committed and how many there are."""
    page.evaluate(
        """() => {
            window.canvasSnapshots = [];
            const canvas = document.querySelector('[data-testid=canvas]');
            new MutationObserver(() => window.canvasSnapshots.push({
                committed: canvas.querySelectorAll('[data-state=committed]').length,
                cells: canvas.querySelectorAll('[data-testid=cell]').length,
            })).observe(canvas, {subtree: true, childList: true, attributes: true, attributeFilter: ['data-state']});
        }"""
    )


def test_the_canvas_fills_in_step_by_step_and_ends_as_the_api_answers(playground, bentoml_server):
    page = playground
    steps_input = page.get_by_test_id("num_denoising_steps")
    assert (steps_input.get_attribute("min"), steps_input.get_attribute("max")) == ("1", str(engine_params.MAX_STEPS))
    assert page.get_by_test_id("max_tokens").get_attribute("placeholder") == str(engine_params.DEFAULT_GEN_LENGTH)

    watch_the_canvas(page)
    send(page, PROMPT, max_tokens=32, num_denoising_steps=32)
    assert page.get_by_test_id("status").get_attribute("data-state") == "done"

    # The page sent what the form says, and nothing the user left empty.
    (body,) = chat_requests(page)
    assert body == {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 32,
        "num_denoising_steps": 32,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    # The final text is the API's (a non-streamed call with the same settings).
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    completion = httpx.post(f"{bentoml_server}/v1/chat/completions", json=plain, timeout=120).json()
    answer = completion["choices"][0]["message"]["content"]
    assert answer and page.get_by_test_id("answer").text_content() == answer

    # Each cell holds the token of the step that committed it; positions no step committed stay masked. Stop
    # tokens are marked, and so is everything after the first one (cut from the answer).
    steps = stream_steps(bentoml_server, body)
    assert len(steps) == completion["diffusion"]["num_forward_passes"] > 2
    stop_ids = {t["token_id"] for t in httpx.get(f"{bentoml_server}/playground/settings.json").json()["stop_tokens"]}
    expected = [{"state": "masked", "step": None, "token_id": None, "eos": False} for _ in range(32)]
    for step in steps:
        for token in step["committed"]:
            expected[token["position"]] = {
                "state": "committed",
                "step": step["step"],
                "token_id": token["token_id"],
                "eos": token["token_id"] in stop_ids,
            }
    first_eos = next(i for i, cell in enumerate(expected) if cell["eos"])
    assert 0 < first_eos < 31
    for position, cell in enumerate(expected):
        cell["tail"] = position > first_eos
    assert cells(page) == expected

    # The canvas was seen part-filled after several different steps, each time exactly as the stream had it.
    committed_after = [32 - step["masked_remaining"] for step in steps]
    seen = [s["committed"] for s in page.evaluate("window.canvasSnapshots") if s["cells"] == 32]
    partial = sorted({n for n in seen if 0 < n < committed_after[-1]})
    assert len(partial) >= 3, seen
    assert set(partial) <= set(committed_after), (partial, committed_after)
    assert seen == sorted(seen), "a committed cell went back to masked"

    assert all(r.url.startswith(f"{bentoml_server}/") for r in page.requests), [r.url for r in page.requests]
    assert page.errors == []


def test_the_scrubber_replays_the_run(playground, bentoml_server):
    page = playground
    send(page, PROMPT, max_tokens=32, block_length=8)
    (body,) = chat_requests(page)
    steps = stream_steps(bentoml_server, body)
    final = cells(page)

    scrub = page.get_by_test_id("scrub")
    assert scrub.get_attribute("max") == str(len(steps))
    scrub.focus()
    page.keyboard.press("Home")
    assert {c["state"] for c in cells(page)} == {"masked"}
    for shown in range(1, len(steps) + 1):
        page.keyboard.press("ArrowRight")
        committed = [c for c in cells(page) if c["state"] == "committed"]
        assert len(committed) == 32 - steps[shown - 1]["masked_remaining"], shown
        assert max(c["step"] for c in committed) == shown - 1
    assert cells(page) == final

    page.keyboard.press("Home")
    page.get_by_test_id("replay").click()
    expect(scrub).to_have_value(str(len(steps)), timeout=30_000)
    assert cells(page) == final


def test_a_second_turn_sends_the_conversation(playground, bentoml_server):
    page = playground
    send(page, "My name is Ada.", max_tokens=16)
    first = page.get_by_test_id("answer").text_content()
    page.get_by_test_id("prompt").fill("What is my name?")
    page.get_by_test_id("send").click()
    expect(page.locator("[data-testid=transcript] li")).to_have_count(4)
    page.wait_for_selector(FINISHED, timeout=60_000)
    assert page.get_by_test_id("status").get_attribute("data-state") == "done"

    history = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "What is my name?"},
    ]
    assert chat_requests(page)[-1]["messages"] == history
    completion = httpx.post(
        f"{bentoml_server}/v1/chat/completions", json={"messages": history, "max_tokens": 16}, timeout=120
    ).json()
    assert page.get_by_test_id("answer").text_content() == completion["choices"][0]["message"]["content"]


def test_api_errors_are_shown_with_the_api_message(playground, bentoml_server):
    page = playground
    send(page, PROMPT, max_tokens=32, num_denoising_steps=64)  # more steps than the block has tokens
    assert page.get_by_test_id("status").get_attribute("data-state") == "error"
    (body,) = chat_requests(page)
    refused = httpx.post(f"{bentoml_server}/v1/chat/completions", json=body, timeout=120)
    assert refused.status_code == 400
    error = refused.json()["error"]
    shown = page.get_by_test_id("error")
    assert shown.is_visible()
    assert error["message"] in shown.text_content() and error["param"] in shown.text_content()
    # The turn did not happen: the text is back in the box, the transcript is empty.
    assert page.get_by_test_id("prompt").input_value() == PROMPT
    assert page.locator("[data-testid=transcript] li").count() == 0


def test_screenshot_script_matches_the_page(playground):
    """The screenshot script drives the page through the same hooks (a renamed hook would break it silently)."""
    source = Path(__file__).resolve().parent.parent.joinpath("scripts", "playground_screenshot.py").read_text()
    for hook in set(re.findall(r'get_by_test_id\("(\w+)"\)', source)):
        assert playground.get_by_test_id(hook).count() == 1, hook
