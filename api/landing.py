"""GET /: this server's own landing page: what it is, the loaded model, where to go next, one curl that works.

BentoML's generic index page used to sit here ("BentoML Prediction Service", a version badge, a call to
Google Tag Manager); its native-API explorer is still served, without the tag manager, at /bentoml
(server/index_page.py). This page is plain HTML built on the server, with one inline stylesheet allowed by
its hash: the Content-Security-Policy lets it load nothing, from anywhere, but that stylesheet and the
favicon (tests/test_pages_offline.py checks it in Chromium).
"""

from __future__ import annotations

import base64
import hashlib
import json
from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

FAVICON = "/docs/assets/favicon.png"  # served by api/docs.py
STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
h1 { margin-bottom: 0; } .tagline { margin-top: .25rem; color: #555; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; }
dt { font-weight: 600; } dd { margin: 0; }
pre { background: #f3f3f5; padding: .75rem 1rem; overflow-x: auto; border-radius: 6px; }
code, pre { font-family: ui-monospace, monospace; font-size: .9em; }
li { margin: .2rem 0; }
@media (prefers-color-scheme: dark) {
  body { background: #17171a; color: #e8e8ea; } .tagline { color: #aaa; } pre { background: #26262b; }
  a { color: #8ab4f8; }
}
""".strip()
STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{STYLE_HASH}'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CONTENT_SECURITY_POLICY}

# (path, what it is): the pages and endpoints a first visit wants.
LINKS = (
    ("/docs", "API reference (Swagger UI): every field, its diffusion meaning, what is refused"),
    ("/redoc", "the same reference as ReDoc"),
    ("/playground", "watch a completion's canvas denoise, step by step"),
    ("/v1/models", "the loaded model (OpenAI's model list)"),
    ("/metrics", "Prometheus metrics"),
    ("/bentoml", "BentoML's own explorer, for its native API (POST /generate, /generate_stream)"),
)
FAMILIES = {"llada": "LLaDA", "dream": "Dream", "llada2": "LLaDA2 (block diffusion)"}

landing_router = APIRouter(include_in_schema=False)


def example_curl(base_url: str, with_key: bool) -> str:
    """A chat completion request that this server, as configured, answers."""
    body = json.dumps({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    lines = [f"curl {base_url}/v1/chat/completions", "-H 'Content-Type: application/json'"]
    if with_key:
        lines.append('-H "Authorization: Bearer $DLLM_API_KEY"')
    lines.append(f"-d '{body}'")
    return " \\\n  ".join(lines)


def model_rows(engine: Any) -> str:
    if engine is None:
        return '<dt>Model</dt><dd>loading (<a href="/readyz">/readyz</a> turns 200 when it is ready)</dd>'
    family = FAMILIES.get(engine.family, engine.family or "unknown")
    rows = [("Model", f"<code>{escape(engine.model_name)}</code>"), ("Family", escape(family))]
    if engine.max_sequence_length:
        rows.append(("Sequence length", str(engine.max_sequence_length)))
    if engine.quantization != "none":
        rows.append(("Quantization", escape(engine.quantization)))
    return "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)


def render(base_url: str, engine: Any, with_key: bool) -> str:
    links = "".join(f'<li><a href="{path}">{path}</a>: {escape(what)}</li>' for path, what in LINKS)
    key_note = (
        "<p>This server requires an API key on <code>/v1</code> (<code>Authorization: Bearer</code>).</p>"
        if with_key
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dllm-serve</title>
<link rel="icon" type="image/png" href="{FAVICON}">
<style>{STYLE}</style>
</head>
<body>
<h1>dllm-serve</h1>
<p class="tagline">A diffusion language model behind an OpenAI-compatible API: point any OpenAI client at
<code>{escape(base_url)}/v1</code>.</p>
<dl>{model_rows(engine)}</dl>
<h2>Try it</h2>
{key_note}<pre><code>{escape(example_curl(base_url, with_key))}</code></pre>
<p>Diffusion fills a fixed canvas of <code>max_tokens</code> positions over denoising steps; streaming sends one
chunk per step. What differs from OpenAI, and why, is in the reference.</p>
<h2>Pages</h2>
<ul>{links}</ul>
</body>
</html>
"""


@landing_router.get("/")
async def landing_page(request: Request) -> HTMLResponse:
    base_url = str(request.base_url).rstrip("/")
    engine = getattr(request.app.state, "engine", None)
    with_key = request.app.state.settings.api_key is not None
    return HTMLResponse(render(base_url, engine, with_key), headers=HEADERS)
