"""The HTTP surface around the endpoints: offline /docs and /redoc, BentoML's index page, an honest
OpenAPI schema (auth declared only with a key, event streams declared as such), 405s with `Allow`, and
a bounded schemathesis run against a real server that may only find the failures listed below."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import pytest

from engine.params import KNOBS

# --- /docs, /redoc and BentoML's / ---------------------------------------------------------------------

URL_ATTRIBUTES = re.compile(r"""(?:src|href|url|spec-url)\s*[=:]\s*["']([^"']+)["']""", re.IGNORECASE)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_everything_from_this_server(service_client, page):
    response = service_client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    urls = URL_ATTRIBUTES.findall(html)
    assert len(urls) >= 3, urls  # the script, the favicon and the schema at least
    assert not re.search(r"(https?:)?//", html), "the page references another host"
    for url in urls:
        assert url.startswith("/"), url
        asset = service_client.get(url)
        assert asset.status_code == 200 and asset.content, url
    if page == "/docs":
        assert '"validatorUrl": null' in html  # Swagger UI would otherwise send the schema's URL out


def test_docs_assets_are_only_the_listed_files(service_client):
    assert service_client.get("/docs/assets/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    response = service_client.get("/docs/assets/__init__.py")  # beside the assets in the package's folder
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert service_client.get("/docs/assets/../../service.py").status_code == 404


def test_docs_and_bentomls_index_say_what_this_is_and_link_the_pages(service_client):
    api = service_client.get("/openapi.json").json()["info"]["description"]
    bentoml_index = service_client.get("/docs.json").json()["info"]["description"]  # what BentoML's / renders
    for description in (api, bentoml_index):
        for link in ("(/docs)", "(/v1/models)", "(/playground)"):
            assert link in description, (link, description)
    assert "diffusion" in bentoml_index and "This is a Machine Learning Service" not in bentoml_index
    assert "/generate" in bentoml_index


# --- the OpenAPI schema ----------------------------------------------------------------------------------


def test_bearer_auth_is_declared_only_while_a_key_is_set(service_client, configure_app):
    open_spec = service_client.get("/openapi.json").json()
    assert "security" not in json.dumps(open_spec["paths"]) and "securitySchemes" not in open_spec["components"]
    configure_app(api_key="k")
    keyed = service_client.get("/openapi.json").json()
    assert keyed["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The key the server was started with.",
    }
    for path, item in keyed["paths"].items():
        for operation in item.values():
            assert (operation.get("security") == [{"bearer": []}]) == path.startswith("/v1/"), path
    assert service_client.get("/v1/models").status_code == 401  # and it is enforced
    assert service_client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    assert service_client.get("/v1/models", headers={"Authorization": "Basic k"}).status_code == 401


@pytest.mark.parametrize(
    ("path", "request_schema", "chunk_schema"),
    [
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletionChunk"),
        ("/v1/completions", "CompletionRequest", "TextCompletion"),
    ],
)
def test_generation_routes_declare_their_body_and_their_event_stream(
    service_client, path, request_schema, chunk_schema
):
    spec = service_client.get("/openapi.json").json()
    operation = spec["paths"][path]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body == f"#/components/schemas/{request_schema}"
    content = operation["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    assert content["text/event-stream"]["schema"]["type"] == "string"
    assert content["text/event-stream"]["x-sse-data-schema"]["$ref"] == f"#/components/schemas/{chunk_schema}"
    assert chunk_schema in spec["components"]["schemas"]


# --- 405 ----------------------------------------------------------------------------------------------

WRONG_METHODS = [
    ("PUT", "/v1/chat/completions", "POST"),
    ("GET", "/v1/chat/completions", "POST"),
    ("DELETE", "/v1/completions", "POST"),
    ("POST", "/v1/models", "GET"),
    ("PATCH", "/v1/models/tiny-llada-chat", "GET"),
]


@pytest.mark.parametrize(("method", "path", "allow"), WRONG_METHODS, ids=[f"{m} {p}" for m, p, _ in WRONG_METHODS])
def test_a_wrong_method_on_a_route_is_a_405_with_allow(service_client, method, path, allow):
    response = service_client.request(method, path)
    assert response.status_code == 405 and response.headers["Allow"] == allow
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("method_not_allowed", "invalid_request_error")
    assert allow in error["message"]
    assert service_client.request(method, "/v1/no-such-route").status_code == 404


# --- schemathesis ------------------------------------------------------------------------------------------

# Schema-valid requests that the server refuses, and why: rules that span several fields or depend on the
# loaded model, which a JSON schema does not express. Any other failure fails the test.
DOCUMENTED_REFUSALS = {
    "num_denoising_steps": "must fit the blocks (a multiple of their number, at most block_length per block)",
    "block_length": "must divide the canvas",
    "block_schedule": "only uniform with confidence_threshold",
    "confidence_threshold": "not with use_local_leap",
    "local_leap_anchor_threshold": "only with use_local_leap: true",
    "local_leap_neighbor_threshold": "only with use_local_leap: true",
    "local_leap_radius": "only with use_local_leap: true",
    "max_tokens": "the prompt plus the canvas must fit the model's sequence length",
    "max_completion_tokens": "the same, and must equal max_tokens when both are given",
    "target_length": "the same, and must equal max_tokens when both are given",
    "stream_options": "only with stream: true",
    "kv_cache": "the cache must fit the server's KV-cache budget",
    "prompt": "token ids must be in the model's vocabulary and not the mask id",
}
# The knobs' own conditions (engine/params.py): a setting its switch or its family does not allow is a 400 on it.
DOCUMENTED_REFUSALS = {
    spec.name: f"only with {spec.requires}" if spec.requires else f"only for {', '.join(spec.families)} models"
    for spec in KNOBS
    if spec.requires or spec.families
} | DOCUMENTED_REFUSALS
# JSON Schema counts 4.0 as an integer; this API's strict types do not (docs/api.md: "a float is never an
# integer"), so a schema-valid 4.0 for an integer field is refused on that field.
STRICT_INTEGER = "Input should be a valid integer"
MAX_EXAMPLES = 15  # per operation and phase: about 500 requests in all, most of them quick 400s


def failures(report: str) -> list[tuple[str, int, dict | str]]:
    """(check, status, response body) of every failed check in a schemathesis ndjson report."""
    found = []
    for line in report.splitlines():
        event = json.loads(line)
        recorder = event.get("ScenarioFinished", {}).get("recorder", {})
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] == "success":
                    continue
                response = recorder["interactions"][case_id]["response"] or {}
                raw = base64.b64decode((response.get("content") or {}).get("$base64", "")).decode(errors="replace")
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                found.append((check["name"], response.get("status_code"), body))
    return found


def documented(check: str, status: int, body: dict | str) -> bool:
    if check != "positive_data_acceptance" or status != 400 or not isinstance(body, dict):
        return False
    error = body["error"]
    return error["code"] == "invalid_value" and (
        error["param"] in DOCUMENTED_REFUSALS or error["message"].endswith(f"{STRICT_INTEGER}.")
    )


@pytest.mark.slow
def test_bounded_schemathesis_run_finds_only_documented_failures(bentoml_server, tmp_path):
    pytest.importorskip("schemathesis")
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{bentoml_server}/openapi.json"]
    command += ["--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", "14", "--workers", "1"]
    command += ["--request-timeout", "120", "--report", "ndjson", "--report-dir", str(tmp_path), "--no-color"]
    # In tmp_path: schemathesis keeps a cache of its findings in the working directory.
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    [report] = tmp_path.glob("*.ndjson")
    text = report.read_text()
    assert '"ScenarioFinished"' in text, run.stdout[-3000:]
    undocumented = [failure for failure in failures(text) if not documented(*failure)]
    assert not undocumented, run.stdout[-3000:]
    assert run.returncode in (0, 1), run.stderr[-3000:]  # 1: the documented failures were found


# --- one log line per request ------------------------------------------------------------------------


def test_bentomls_access_line_is_dropped_for_requests_the_app_logs_itself():
    import logging

    from server.logs import SkipRequestsTheAppLogs

    def access_record(path: str) -> logging.LogRecord:
        # The shape of BentoML 1.4's access line (bentoml/_internal/server/http/access.py).
        request = f"scheme=http,method=POST,path={path},type=application/json,length=39"
        args = ("127.0.0.1:50254", request, "status=200,type=application/json,length=5", 12.5)
        return logging.LogRecord("bentoml.access", logging.INFO, __file__, 1, "%s (%s) (%s) %.3fms", args, None)

    keep = SkipRequestsTheAppLogs().filter
    assert not keep(access_record("/v1/chat/completions")) and not keep(access_record("/docs"))
    assert not keep(access_record("/generate")) and not keep(access_record("/generate_stream"))  # server/native.py
    assert keep(access_record("/readyz"))
    assert keep(logging.LogRecord("bentoml.access", logging.INFO, __file__, 1, "client connected", (), None))
