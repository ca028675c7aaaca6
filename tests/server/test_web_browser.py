"""The web chat page in a real headless browser (issue 14, Must show 3), against the shared `tokenmill
serve` process (which has --api-key): the page asks for the key, sends a message and shows the streamed
answer with its tokens/s and time to first token, Stop aborts an answer mid-stream (the server counts the
abort), a reload finds the conversations again, and a prompt too long for the context shows the server's
error text. The browser is the system's chromium (Debian's `chromium` package, driven by playwright with
`executable_path`; no browser is ever downloaded); the test skips, saying why, where there is none. A
screenshot of the page is saved in the test's tmp_path (its path is printed).

Waits go through playwright's locators, never page.evaluate strings: the page's Content-Security-Policy
forbids eval, which is what playwright's wait_for_function would need."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import API_KEY
from server_process import ServerProcess, wait_for

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

# the context of the shared server (tests/server/server_process.py's MODEL_ARGS)
MAX_MODEL_LEN = 2048
TIMEOUT_MS = 30_000


def find_chromium() -> str | None:
    """$TOKENMILL_CHROMIUM, else a chromium or chrome on PATH."""
    named = os.environ.get("TOKENMILL_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium found (apt-get install chromium, or set TOKENMILL_CHROMIUM): the browser test "
                    "never downloads one")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path)
        yield b
        b.close()


def aborted(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines() if ln.startswith("tokenmill:request_success_total")
                and 'finished_reason="abort"' in ln)
    return float(line.rsplit(" ", 1)[1])


def sign_in(page: Any, server: ServerProcess) -> None:
    """Open the page without the key; its first /v1 call meets the 401 and asks for the key, once."""
    expect = playwright_api.expect
    page.goto(server.url)
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key-input", API_KEY)
    page.keyboard.press("Enter")
    expect(page.locator("#model option")).to_have_count(1)


def test_chat_page_in_a_browser(server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    expect = playwright_api.expect
    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    requested: list[str] = []
    page_errors: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        sign_in(page, server)
        assert page.locator("#model").input_value()  # the served model, from /v1/models
        page.click("#settings-toggle")
        page.fill("#temperature", "0")

        # Shift+Enter is a new line, Enter sends
        page.click("#input")
        page.keyboard.type("Hel")
        page.keyboard.press("Shift+Enter")
        assert page.locator("#input").input_value() == "Hel\n"
        assert page.locator(".message").count() == 0
        page.fill("#input", "Hello")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer.locator(".stats")).to_contain_text("tok/s")
        expect(answer.locator(".stats")).to_contain_text("time to first token")
        assert answer.locator(".body").inner_text().strip()

        # a long answer in a new conversation: text arrives while it streams, then Stop aborts it
        page.click("#new-chat")
        before = aborted(server)
        page.fill("#input", "Count from 1 to 100, separated by commas.")
        page.keyboard.press("Enter")
        streaming = page.locator(".message.assistant.streaming .body")
        expect(streaming).to_contain_text("3,")
        expect(page.locator("#stop")).to_be_visible()
        page.click("#stop")
        expect(page.locator("#send")).to_be_visible()
        stopped = page.locator(".message.assistant").last
        expect(stopped.locator(".stats")).to_contain_text("stopped")
        partial = stopped.locator(".body").inner_text()
        assert "1, 2, 3," in partial and "99, 100" not in partial, partial
        assert wait_for(lambda: aborted(server) == before + 1, timeout=20), "the server did not count the abort"

        # a reload finds both conversations, the open one with its stopped answer
        page.reload()
        expect(page.locator("#conversations li")).to_have_count(2)
        titles = page.locator("#conversations .title").all_inner_texts()
        assert titles == ["Count from 1 to 100, separated by commas.", "Hello"], titles
        expect(page.locator(".message.assistant .body").last).to_have_text(partial)
        expect(page.locator(".message.assistant .stats").last).to_contain_text("stopped")
        page.locator("#conversations .title", has_text="Hello").click()
        expect(page.locator(".message.user .body")).to_have_text("Hello")

        # a prompt longer than the context: the server's 400 and its text, in the answer's place
        page.click("#new-chat")
        page.fill("#input", "word " * (MAX_MODEL_LEN + 100))
        page.keyboard.press("Enter")
        error = page.locator(".message.assistant .error")
        expect(error).to_contain_text("400")
        expect(error).to_contain_text(f"maximum context length is {MAX_MODEL_LEN} tokens")
        expect(page.locator(".message.user.excluded")).to_have_count(1)  # not sent again with the next message

        # deleting a conversation
        page.locator("#conversations li", has_text="Hello").locator(".delete").click()
        expect(page.locator("#conversations li")).to_have_count(2)

        page.locator("#conversations .title", has_text="Count from").click()  # the screenshot's subject
        page.click("#settings-toggle")
        expect(page.locator("#settings")).to_be_visible()
        shot = tmp_path / "web-page.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
    finally:
        context.close()
    assert not page_errors, page_errors
    assert all(url.startswith(server.url + "/") or url.startswith("data:") for url in requested), requested


def test_a_thinking_answer_shows_its_reasoning_apart(server: ServerProcess, browser: Any) -> None:
    """With --reasoning-parser the stream carries `reasoning` deltas before the content: the page shows them
    in a "Thinking" box above the answer, not in it. The stream is the server's shape, played by the browser's
    router (the shared server's model does not think)."""
    import json

    expect = playwright_api.expect
    expect.set_options(timeout=TIMEOUT_MS)
    deltas = [{"role": "assistant", "content": ""}, {"reasoning": "Two and ", "reasoning_content": "Two and "},
              {"reasoning": "two make four.", "reasoning_content": "two make four."}, {"content": "It is **4**."}]
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.route("**/v1/chat/completions", lambda route: route.fulfill(status=200, body=body,
                                                                      headers={"Content-Type": "text/event-stream"}))
    try:
        sign_in(page, server)
        page.fill("#input", "What is two plus two?")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer.locator(".body")).to_have_text("It is 4.")
        expect(answer.locator("details.reasoning .thought")).to_have_text("Two and two make four.")
        expect(answer.locator("details.reasoning summary")).to_have_text("Thinking")
    finally:
        context.close()
    assert not page_errors, page_errors
