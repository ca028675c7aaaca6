"""The SSE stream checked frame by frame at the byte level."""

from __future__ import annotations

import json

import httpx
from conftest import API_KEY
from server_process import ServerProcess

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _frames(server: ServerProcess, path: str, body: dict) -> tuple[httpx.Response, bytes]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=HEADERS, timeout=60) as r:
        raw = b"".join(r.iter_raw())
    return r, raw


def _split(raw: bytes) -> list[bytes]:
    """Every frame is exactly b'data: <payload>' followed by one blank line; nothing else is in the stream."""
    assert raw.endswith(b"\n\n"), raw[-40:]
    frames = raw[:-2].split(b"\n\n")
    for f in frames:
        assert f.startswith(b"data: "), f[:40]
        assert b"\n" not in f and b"\r" not in f, f  # one line per frame
    return [f[len(b"data: "):] for f in frames]


def test_completion_sse_bytes(server: ServerProcess) -> None:
    r, raw = _frames(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0, "n": 2,
                                                 "stream": True, "stream_options": {"include_usage": True},
                                                 "ignore_eos": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = _split(raw)
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    *token_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": usage["usage"]["prompt_tokens"],
                                                         "completion_tokens": 12,
                                                         "total_tokens": usage["usage"]["prompt_tokens"] + 12}
    finish_by_index: dict[int, list] = {0: [], 1: []}
    for c in token_chunks:
        assert c["object"] == "text_completion" and len(c["choices"]) == 1
        choice = c["choices"][0]
        finish_by_index[choice["index"]].append(choice["finish_reason"])
    for finishes in finish_by_index.values():  # the last chunk of each choice, and only it, has a reason
        assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])


def test_chat_sse_bytes(server: ServerProcess) -> None:
    r, raw = _frames(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                      "max_tokens": 5, "temperature": 0, "stream": True})
    payloads = _split(raw)
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["choices"][0]["index"] == 0 for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all(c.get("usage") is None for c in chunks)  # no include_usage: no usage chunk


def test_error_before_stream_is_plain_json(server: ServerProcess) -> None:
    r, raw = _frames(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 99999, "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert "maximum context length" in json.loads(raw)["error"]["message"]
