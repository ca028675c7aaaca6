"""One streamed request to an OpenAI-compatible server (or Ollama's /api/chat), timed the way vLLM's
`bench serve` times it.

    send -> first token chunk ............ TTFT
    gaps between token chunks ............ ITL (one entry per gap, pooled over requests later)
    send -> end of the stream ............ E2EL
    (E2EL - TTFT) / (output tokens - 1) .. TPOT

A "token chunk" is an SSE frame whose choice carries generated text. A chat stream's first frame often
carries only `role: assistant`; some servers send it before the prompt is even processed, so it does not
count as the first token (vLLM's benchmark counts any frame with choices; on servers that send the role
frame with the first token, the two agree). Output token counts come from the final usage frame
(`stream_options.include_usage`); without one, token chunks are counted. Ollama's stream (NDJSON, told
by its content type) has a token chunk per object with `message.content` or `response` text, and its
counts in the `done` object (`prompt_eval_count`, `eval_count`).

`SSEStream` and `chunk_text` are the SSE parsing that `bench serve` and `bench soak` share.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenmill.benchmarks.datasets import SampleRequest


@dataclass
class RequestResult:
    """What one request measured (times in seconds, relative to its own send time)."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0  # tokens: the server's usage.prompt_tokens when reported, else the dataset's
    output_len: int = 0  # tokens: usage.completion_tokens when reported, else the number of token chunks
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0  # perf_counter at send
    generated_text: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for single-token outputs."""
        if self.output_len <= 1:
            return None
        return (self.e2el - self.ttft) / (self.output_len - 1)


# --endpoint -> the path it posts to
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "ollama-chat": "/api/chat"}


def build_payload(sample: SampleRequest, endpoint: str, model: str, extra: dict[str, Any] | None = None,
                  temperature: float = 0.0) -> dict[str, Any]:
    """The JSON body: greedy, streamed with usage, exactly `output_len` tokens (ignore_eos). Ollama's API
    has no ignore_eos: `ollama-chat` asks for at most `output_len` tokens (num_predict)."""
    if endpoint == "ollama-chat":
        return {"model": model, "messages": [{"role": "user", "content": sample.prompt}], "stream": True,
                "options": {"temperature": temperature, "num_predict": sample.output_len}, **(extra or {})}
    body: dict[str, Any] = {"model": model, "max_tokens": sample.output_len, "temperature": temperature,
                            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": sample.prompt}]
    else:
        body["prompt"] = sample.prompt
    body.update(extra or {})
    return body


class SSEStream:
    """The JSON payloads of a streamed response's `data:` frames, in order, up to `data: [DONE]`.

    `async for msg in SSEStream(resp)`; afterwards `is_done` tells whether the stream ended with [DONE]
    (a server that dies or hangs up mid-stream leaves it False). Lines that are not `data:` are skipped.
    """

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self.is_done = False

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for line in self.resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self.is_done = True
                return
            yield json.loads(data)


class NDJSONStream:
    """The objects of an NDJSON response (Ollama's streams), one per line, up to the one with `done: true`
    (then `is_done`)."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self.is_done = False

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for line in self.resp.aiter_lines():
            if not line.strip():
                continue
            msg = json.loads(line)
            yield msg
            if msg.get("done"):
                self.is_done = True
                return


def frame_news(msg: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(generated text, usage, error) of one streamed frame, OpenAI's or Ollama's."""
    if "error" in msg and not msg.get("choices"):
        return "", None, json.dumps(msg["error"])[:300]
    if "done" in msg and "choices" not in msg:  # Ollama: generate's `response` or chat's `message.content`
        text = (msg.get("message") or {}).get("content") or msg.get("response") or ""
        usage = ({"prompt_tokens": msg.get("prompt_eval_count"), "completion_tokens": msg.get("eval_count")}
                 if msg.get("done") else None)
        return text, usage, None
    text = next((t for choice in msg.get("choices") or () if (t := chunk_text(choice))), "")  # one choice (n=1)
    return text, msg.get("usage") or None, None


def chunk_text(choice: dict[str, Any]) -> str:
    """Generated text in one streamed choice (completions `text`, chat `delta.content`/reasoning)."""
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")


async def send_request(client: httpx.AsyncClient, url: str, body: dict[str, Any], sample: SampleRequest,
                       headers: dict[str, str] | None = None) -> RequestResult:
    """POST `body` to `url`, read the SSE stream to its end, and time it. Never raises for HTTP errors:
    a failed request comes back with success False and the reason in `error`."""
    res = RequestResult(prompt_len=sample.prompt_len)
    num_chunks = 0
    last = 0.0
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    res.start = t0 = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                raw = await resp.aread()
                res.error = f"HTTP {resp.status_code}: {raw[:300].decode(errors='replace')}"
                return res
            is_ndjson = resp.headers.get("content-type", "").startswith("application/x-ndjson")
            async for msg in NDJSONStream(resp) if is_ndjson else SSEStream(resp):
                now = time.perf_counter()
                text, frame_usage, error = frame_news(msg)
                if error is not None:
                    res.error = f"stream error: {error}"
                    return res
                usage = frame_usage or usage
                if not text:
                    continue
                if num_chunks == 0:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last = now
                num_chunks += 1
                parts.append(text)
        res.e2el = time.perf_counter() - t0
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.generated_text = "".join(parts)
    if usage is not None:
        res.output_len = int(usage.get("completion_tokens") or num_chunks)
        res.prompt_len = int(usage.get("prompt_tokens") or sample.prompt_len)
    else:
        res.output_len = num_chunks
    if num_chunks == 0:
        res.error = "the stream carried no tokens"
        return res
    res.success = True
    return res
