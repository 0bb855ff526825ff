"""The human-facing pages: /docs (Swagger UI) and /redoc, served entirely from this server.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without internet (air-gapped
deployments are common for model servers) /docs is a blank page. The `fastapi-offline` package installs
the same JavaScript and CSS files; they are served from here, and the pages reference no other host
(tests/test_openai_surface.py checks it). Swagger UI's online validator badge is turned off for the same
reason: it would send the schema's address to an outside service, and ReDoc's "API docs by Redocly" logo, which
its bundle loads from cdn.redoc.ly, is cut from the copy served here (the link text stays).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from schemas.errors import APIError

ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
ASSETS_PATH = "/docs/assets"
# The files the pages load; nothing else in the package's folder is served.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}

# ReDoc's bundle loads its sidebar logo from a CDN. An empty data URL is no request and no image: the bundle's
# onError hook (there for a CDN that cannot be reached) then removes the element.
REDOC_LOGO = b'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"'
CACHE_HEADERS = {"Cache-Control": "max-age=86400"}  # versioned by the installed package: a day is safe

docs_router = APIRouter(include_in_schema=False)


@cache
def redoc_bundle() -> bytes:
    """ReDoc's bundle without its CDN logo."""
    return (ASSETS_DIR / "redoc.standalone.js").read_bytes().replace(REDOC_LOGO, b'src:"data:,"')


# The two pages' handlers are alike in shape but not merged: each passes its own FastAPI helper arguments that
# the other lacks, and a shared function would only move those into a table.
@docs_router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    app: FastAPI = request.app
    return get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - API reference",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        swagger_ui_parameters={"validatorUrl": None},  # no schema sent to validator.swagger.io
    )


@docs_router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    app: FastAPI = request.app
    return get_redoc_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )


@docs_router.get("/favicon.ico")
async def favicon() -> Response:
    # What browsers ask for on pages that name no icon (JSON, /metrics): without it each logs a 404.
    return FileResponse(ASSETS_DIR / "favicon.png", media_type="image/png", headers=CACHE_HEADERS)


@docs_router.get(ASSETS_PATH + "/{name}")
async def docs_asset(name: str, request: Request) -> Response:
    if name not in ASSETS:
        raise APIError.not_found(request.method, request.url.path)
    if name == "redoc.standalone.js":
        return Response(redoc_bundle(), media_type=ASSETS[name], headers=CACHE_HEADERS)
    return FileResponse(ASSETS_DIR / name, media_type=ASSETS[name], headers=CACHE_HEADERS)
