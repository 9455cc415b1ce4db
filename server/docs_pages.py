"""/docs (Swagger UI) and /redoc served with their scripts and styles from this machine, so the
pages work offline (FastAPI's defaults load them from a CDN). The files come from the
`fastapi-offline` package (its `static/` folder); without it the CDN pages stay."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger("segfuse.server")

STATIC_URL = "/static-docs"


def assets_dir() -> Path | None:
    try:
        import fastapi_offline
    except ImportError:
        return None
    d = Path(fastapi_offline.__file__).parent / "static"
    return d if (d / "swagger-ui-bundle.js").exists() else None


def offline_docs_kwargs() -> dict:
    """FastAPI(...) arguments: its CDN pages off when the local files are there."""
    return {"docs_url": None, "redoc_url": None} if assets_dir() is not None else {}


def install(app: FastAPI) -> None:
    static = assets_dir()
    if static is None:
        log.warning("fastapi-offline is not installed: /docs and /redoc load their scripts from a CDN")
        return
    app.mount(STATIC_URL, StaticFiles(directory=str(static)), name="static-docs")

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
                                   swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png")

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    async def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png", with_google_fonts=False)
