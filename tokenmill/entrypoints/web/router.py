"""The web chat page as one APIRouter: `/` by content negotiation, and the page's assets under /web/.

    GET / with Accept naming text/html (a browser)  -> static/index.html
    GET / otherwise, and HEAD /                      -> 200 "tokenmill is running" (Ollama's answer, which
                                                        its clients and Open WebUI probe for)
    GET /web/<name>                                  -> static/<name> (app.js, markdown.js, style.css, ...)

Every asset is read from the package once, when the router is built; nothing is fetched from another host
(the page's Content-Security-Policy allows this origin only). `/` and the assets are public paths: they load
without --api-key (the page asks for the key when /v1 answers 401).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tokenmill.entrypoints.server.app import ServerContext

RUNNING_TEXT = "tokenmill is running"
ASSET_PREFIX = "/web/"
_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8"}
# the page and its scripts may reach this origin only; no inline script or style can run
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # revalidate: a new tokenmill's page replaces the old one
}


@dataclass(frozen=True)
class Asset:
    content: bytes
    media_type: str


def load_assets() -> dict[str, Asset]:
    """static/'s files with a known media type, by file name."""
    static = resources.files(__package__ or "tokenmill.entrypoints.web") / "static"
    assets = {}
    for entry in static.iterdir():
        suffix = entry.name[entry.name.rfind("."):] if "." in entry.name else ""
        if entry.is_file() and suffix in _MEDIA_TYPES:
            assets[entry.name] = Asset(entry.read_bytes(), _MEDIA_TYPES[suffix])
    return assets


def wants_html(accept: str) -> bool:
    """True when an Accept header names text/html (or XHTML) with a q above 0, as browsers' navigations do;
    `*/*` alone (curl, the ollama clients, httpx) is not a browser."""
    for media_range in accept.split(","):
        media_type, *params = (part.strip() for part in media_range.split(";"))
        if media_type.lower() not in ("text/html", "application/xhtml+xml"):
            continue
        q = next((p.partition("=")[2] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:  # a malformed q is ignored, as if absent
            return True
    return False


def build_router(ctx: ServerContext) -> APIRouter:
    """`/` and the page's assets; registers them as public paths on `ctx`."""
    assets = load_assets()
    page = assets.pop("index.html")
    router = APIRouter()

    @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root(request: Request) -> Response:
        if request.method == "GET" and wants_html(request.headers.get("accept", "")):
            return Response(page.content, media_type=page.media_type, headers={**_PAGE_HEADERS, "Vary": "Accept"})
        return Response(RUNNING_TEXT, media_type="text/plain; charset=utf-8", headers={"Vary": "Accept"})

    for name, asset in assets.items():
        router.add_api_route(ASSET_PREFIX + name, _asset_endpoint(asset), methods=["GET", "HEAD"],
                             include_in_schema=False)
    ctx.public_paths.update({"/", *(ASSET_PREFIX + name for name in assets)})
    return router


def _asset_endpoint(asset: Asset) -> Callable[[], Awaitable[Response]]:
    async def endpoint() -> Response:
        return Response(asset.content, media_type=asset.media_type, headers=_PAGE_HEADERS)

    return endpoint
