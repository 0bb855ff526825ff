"""GET /playground: a page that shows a diffusion model's canvas denoise, step by step, live.

The routes serve the page (static/playground.html), its two assets, and the settings its form is built from
(playground_settings.py).

Everything the page does after loading goes through the public API (`POST /v1/chat/completions` with
`stream: true`), same origin. The Content-Security-Policy makes "no external assets" a rule the browser
enforces: nothing outside this server can be loaded, run or called from the page.
"""

# No `from __future__ import annotations`: FastAPI must see the route's dependency type, a closure variable.
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse

from api.playground_settings import page_settings

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE = STATIC_DIR / "playground.html"
ASSETS = {"playground.js": "text/javascript; charset=utf-8", "playground.css": "text/css; charset=utf-8"}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# no-cache: revalidate (ETag) on each load, so a server upgrade never meets a stale script.
HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CONTENT_SECURITY_POLICY}


def playground_router(engine_dependency: Callable[..., Any]) -> APIRouter:
    """The routes under /playground; `engine_dependency` gives the serving engine (or raises a 503)."""
    router = APIRouter(include_in_schema=False)
    Engine = Annotated[Any, Depends(engine_dependency)]

    @router.get("/playground")
    async def page() -> FileResponse:
        return FileResponse(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)

    @router.get("/playground/settings.json")
    async def settings(engine: Engine) -> dict:
        return page_settings(engine)

    @router.get("/playground/{asset}")
    async def asset(asset: str) -> FileResponse:
        if asset not in ASSETS:
            raise HTTPException(404)  # the app's handler answers in the OpenAI error envelope
        return FileResponse(STATIC_DIR / asset, media_type=ASSETS[asset], headers=HEADERS)

    return router
