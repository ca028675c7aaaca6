"""The web chat page's HTTP side: `/` by content negotiation (a browser gets the page, other clients
Ollama's plain answer), HEAD /, the assets, nothing fetched from another host, and the page loading without
the API key while /v1 still needs it. The app (OpenAI and web routers, with --api-key) is called in
process; the page in a real browser is test_web_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
from asgi_app import call

KEY = "web-key"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


@pytest.fixture(scope="module")
def app(small_llm: Any) -> Iterator[Any]:
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.server.app import build_app
    from tokenmill.entrypoints.server.config import ServerConfig
    from tokenmill.entrypoints.web import router as web_router

    async_engine = AsyncEngine(small_llm.engine)
    yield build_app(async_engine, ServerConfig(api_key=KEY, log_requests=False),
                    routers=[openai_router.build_router, web_router.build_router])
    assert not async_engine.is_dead, async_engine.dead_reason
    async_engine.shutdown()


def static_files() -> dict[str, str]:
    static = resources.files("tokenmill.entrypoints.web") / "static"
    return {f.name: f.read_text() for f in static.iterdir() if f.is_file()}


def test_a_browser_gets_the_page_without_the_key(app: Any) -> None:
    r = call(app, "GET", "/", headers={"Accept": BROWSER_ACCEPT})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.text == static_files()["index.html"]
    assert r.headers["vary"] == "Accept"
    # the page's own guard: scripts, styles and fetches from this origin only
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp


@pytest.mark.parametrize("accept", [None, "*/*", "application/json", "text/plain", "text/html;q=0",
                                    "application/x-ndjson, */*"])
def test_other_clients_get_ollamas_answer(app: Any, accept: str | None) -> None:
    r = call(app, "GET", "/", headers={"Accept": accept} if accept is not None else {})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == "tokenmill is running"


@pytest.mark.parametrize("accept", [None, BROWSER_ACCEPT])
def test_head_answers_200(app: Any, accept: str | None) -> None:
    r = call(app, "HEAD", "/", headers={"Accept": accept} if accept is not None else {})
    assert r.status_code == 200


def test_the_assets_are_served_without_the_key(app: Any) -> None:
    files = static_files()
    page = files["index.html"]
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page)
    local = [ref for ref in referenced if not ref.startswith("data:")]
    assert set(local) == {"/web/app.js", "/web/markdown.js", "/web/style.css"}, referenced
    types = {".js": "text/javascript", ".css": "text/css"}
    for path in local:
        r = call(app, "GET", path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith(types[path[path.rfind("."):]])
        assert r.text == files[path.removeprefix("/web/")]
    # every shipped file is reachable (the page at /, the rest under /web/)
    assert {f"/web/{name}" for name in files if name != "index.html"} == set(local)


def test_nothing_references_another_host() -> None:
    for name, text in static_files().items():
        found = re.findall(r"https?://\S*", text)
        assert not found, f"{name} references {found}"
        # and no protocol-relative fetch (//host/...) in a src or href
        assert not re.search(r'(?:src|href)\s*=\s*["\']//', text), name


def test_v1_still_needs_the_key(app: Any) -> None:
    assert call(app, "GET", "/v1/models").status_code == 401
    r = call(app, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["data"][0]["id"]
    # only the page's own files are public: any other path under /web/ needs the key like the rest
    assert call(app, "GET", "/web/secret.txt").status_code == 401
    assert call(app, "GET", "/web/secret.txt", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


@pytest.mark.parametrize("accept, is_browser", [
    (BROWSER_ACCEPT, True), ("text/html", True), ("TEXT/HTML; charset=utf-8", True), ("application/xhtml+xml", True),
    ("text/html;q=0", False), ("text/html;q=0.0, */*", False), ("*/*", False), ("", False), ("text/*", False),
    ("text/html;q=bogus", True),
])
def test_wants_html(accept: str, is_browser: bool) -> None:
    from tokenmill.entrypoints.web.router import wants_html

    assert wants_html(accept) is is_browser


def test_serve_mounts_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tokenmill serve` mounts the web router next to the OpenAI, Anthropic and Ollama ones (and starts nothing
    here)."""
    from tokenmill import cli
    from tokenmill.entrypoints.anthropic import router as anthropic_router
    from tokenmill.entrypoints.ollama import router as ollama_router
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.server import lifecycle
    from tokenmill.entrypoints.web import router as web_router

    mounted: list[Any] = []
    monkeypatch.setattr(lifecycle, "run_server", lambda config, engine_config, routers, description: mounted.extend(routers) or 0)
    assert cli.main(["serve", "--port", "0"]) == 0
    assert mounted == [openai_router.build_router, anthropic_router.build_router, ollama_router.build_router,
                       web_router.build_router]
