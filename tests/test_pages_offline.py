"""The pages the server serves, for people: the landing page at `/`, BentoML's explorer at /bentoml, and, in
headless Chromium against a real `bentoml serve`, that no page the server serves asks another host for anything.

Chromium reports what a Content-Security-Policy refused as a console error (a refused request never starts,
so it is not among the page's requests): a page passes only with no request elsewhere and no console error.
"""

from __future__ import annotations

import json
import re
import shlex
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import sync_playwright

from api.landing import CONTENT_SECURITY_POLICY, LINKS
from scripts.playground_screenshot import find_chromium, launch_chromium
from server.index_page import EXPLORER_PATH

# --- the landing page, in-process --------------------------------------------------------------------------


def curl_command(html: str) -> list[str]:
    """The page's curl example, as the argument list a shell would make of it."""
    block = re.search(r"<pre><code>(.*?)</code></pre>", html, re.DOTALL).group(1)
    from html import unescape

    return shlex.split(unescape(block).replace("\\\n", " "))


def test_the_landing_page_says_what_this_is_and_names_the_model(service_client, service_instance):
    response = service_client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    html = response.text
    engine = service_instance.engine
    assert f"<code>{engine.model_name}</code>" in html and "<dd>LLaDA</dd>" in html
    assert "BentoML Prediction Service" not in html and "googletagmanager" not in html
    for path, _ in LINKS:
        assert f'href="{path}"' in html, path
        if path != "/metrics":  # BentoML's metrics need its worker's multiprocess setup: the browser test below
            assert service_client.get(path).status_code == 200, path
    # Nothing on the page is loaded from elsewhere (links are not loads; the curl names this server).
    loaded = re.findall(r'<(?:link|script|img)[^>]*(?:src|href)="([^"]*)"', html)
    assert loaded and all(url.startswith("/") and not url.startswith("//") for url in loaded), loaded


def test_the_landing_pages_curl_works(service_client):
    command = curl_command(service_client.get("/").text)
    assert command[0] == "curl" and command[1] == "http://testserver/v1/chat/completions"
    assert command[command.index("-H") + 1] == "Content-Type: application/json"
    body = json.loads(command[command.index("-d") + 1])
    response = service_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]


def test_with_a_key_the_curl_sends_it(service_client, configure_app):
    configure_app(api_key="k")
    command = curl_command(service_client.get("/").text)
    headers = [command[i + 1] for i, arg in enumerate(command) if arg == "-H"]
    assert "Authorization: Bearer $DLLM_API_KEY" in headers  # shlex keeps the variable for the shell
    body = json.loads(command[command.index("-d") + 1])
    assert service_client.post("/v1/chat/completions", json=body).status_code == 401
    answer = service_client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer k"})
    assert answer.status_code == 200


def test_the_landing_page_while_the_model_loads(service_client, service_instance):
    engine = service_instance.engine
    service_instance.engine = None
    try:
        html = service_client.get("/").text
    finally:
        service_instance.engine = engine
    assert "loading" in html and 'href="/readyz"' in html


def test_bentomls_explorer_moved_to_its_own_path_without_the_tag_manager(service_client):
    response = service_client.get(EXPLORER_PATH)
    assert response.status_code == 200 and "swagger-ui" in response.text
    assert "googletagmanager" not in response.text and "Google Tag Manager" not in response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
    for url in re.findall(r'(?:src|href)="(\./[^"]*|/[^"]*)"', response.text):
        assert service_client.get(f"/{url.removeprefix('./').lstrip('/')}").status_code == 200, url
    assert "validatorUrl: null" in service_client.get(f"{EXPLORER_PATH}/swagger-initializer.js").text


# --- every page in Chromium, against a real server ---------------------------------------------------------

PAGES = ["/", "/docs", "/redoc", "/playground", EXPLORER_PATH, "/v1/models", "/openapi.json", "/metrics"]
# What each page must show once it has rendered (so that an empty page does not pass).
RENDERED = {
    "/": "text=dllm-serve",
    "/docs": ".swagger-ui .information-container",
    "/redoc": "text=OpenAI-compatible",
    "/playground": "[data-testid=send]",
    EXPLORER_PATH: ".swagger-ui .opblock",
}


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium binary on this machine (install the OS package `chromium`)")
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright, executable)
        yield browser
        browser.close()


@pytest.mark.parametrize("path", PAGES)
def test_no_page_asks_another_host_for_anything(browser, bentoml_server, path):
    origin = urlsplit(bentoml_server).netloc
    page = browser.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(bentoml_server + path, wait_until="networkidle")
        if path in RENDERED:
            page.wait_for_selector(RENDERED[path], timeout=30_000)
        page.wait_for_load_state("networkidle")
    finally:
        page.close()
    # data: URLs are no request; a blob: URL (ReDoc's worker) names the origin that made it.
    made_here = [url.removeprefix("blob:") for url in requests if not url.startswith("data:")]
    elsewhere = [url for url in made_here if urlsplit(url).netloc != origin]
    assert elsewhere == [], elsewhere
    assert errors == [], errors
    assert requests[0] == bentoml_server + path
