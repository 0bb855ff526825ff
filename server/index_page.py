"""BentoML's own pages: the service's description (what BentoML's schema, `/docs.json`, says about it), and
BentoML's API explorer, moved from `/` (now the landing page, api/landing.py) to `/bentoml`.

The explorer is BentoML's Swagger UI over `/docs.json`, the one page that documents and tries BentoML's native
API (`POST /generate`, `/generate_stream`). BentoML's page also loads Google Tag Manager; the copy served here
has that block cut out, its own initializer (no online validator badge), and a Content-Security-Policy that
lets it reach this server only.
"""

from __future__ import annotations

import re
from pathlib import Path

import bentoml
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from schemas.openapi import PAGE_LINKS

SERVICE_DESCRIPTION = f"""
**dllm-serve** serves a diffusion language model (LLaDA, Dream, DiffuCoder) behind an OpenAI-compatible API.

{PAGE_LINKS}

- `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's Chat Completions and (legacy) Completions,
  whole or streamed; point any OpenAI client at `http://<this host>/v1`. Every field, its diffusion meaning and
  what is refused: the [API reference](/docs).
- `GET /v1/models`: the loaded model.
- `POST /generate` and `POST /generate_stream` (below): the same engine through BentoML's own API, for
  `bentoml.SyncHTTPClient` / `AsyncHTTPClient` and this page's "Try it out".
- `/readyz`, `/livez`, `/metrics`: readiness, liveness, Prometheus metrics.
""".strip()

EXPLORER_PATH = "/bentoml"
TAG_MANAGER = re.compile(r"<!-- Google Tag Manager.*?<!-- End Google Tag Manager[^>]*-->", re.DOTALL)
# BentoML's swagger-initializer.js, but with the validator badge off: it would send the schema's address out.
INITIALIZER = """window.onload = function () {
  window.ui = SwaggerUIBundle({
    url: "./docs.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    plugins: [SwaggerUIBundle.plugins.DownloadUrl],
    layout: "StandaloneLayout",
  });
};
"""
CONTENT_SECURITY_POLICY = (
    # Swagger UI sets inline style attributes; nothing else inline runs.
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class DescribedService(bentoml.Service):
    """BentoML's schema shows the service's `doc`, which until the service is built into a Bento is a generic
    README ("This is a Machine Learning Service created with BentoML"): show the description."""

    @property
    def doc(self) -> str:
        return self.bento.doc if self.bento is not None and self.bento.doc else self.description or ""


def explorer_html() -> str:
    """BentoML's explorer page, without the tag manager, with this module's initializer."""
    import _bentoml_impl.server as bentoml_server

    html = (Path(bentoml_server.__file__).parent / "main-openapi.html").read_text()
    html = TAG_MANAGER.sub("", html)
    return html.replace("./static_content/swagger-initializer.js", f"{EXPLORER_PATH}/swagger-initializer.js")


def add_bentoml_explorer(app: FastAPI) -> None:
    """Serve BentoML's explorer at /bentoml (its assets and /docs.json are BentoML's own routes)."""
    html = explorer_html()
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}

    async def explorer() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)

    async def initializer() -> Response:
        return Response(INITIALIZER, media_type="text/javascript", headers=headers)

    app.add_api_route(EXPLORER_PATH, explorer, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{EXPLORER_PATH}/swagger-initializer.js", initializer, methods=["GET"], include_in_schema=False)
