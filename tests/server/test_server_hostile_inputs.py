"""A table of hostile inputs against a real server (context 256): each gets its status and a message that
names the problem, in OpenAI's error shape; the server stays healthy and its memory flat."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from server_process import ServerProcess, rss_bytes

MAX_MODEL_LEN = 256
VOCAB = 49152  # SmolLM2's vocabulary
LIMIT = 4 * 2**20  # the default --max-request-bytes
JSON = {"content-type": "application/json"}


@dataclass
class Case:
    name: str
    body: Any = None  # sent as JSON unless `raw` is given
    raw: bytes | None = None
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    status: int = 400
    message: str = ""  # a substring of the error message
    param: str | None = None  # expected `param`, when one field is at fault


def _chat(**kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], **kw}


CASES = [
    Case("invalid JSON", raw=b'{"prompt": "hi",', message="not valid JSON"),
    Case("body not an object", body=[1, 2, 3], message="must be a JSON object"),
    Case("no content type from a browser", raw=b'{"prompt": "hi"}', headers={"origin": "http://evil.example"},
         message="must be a JSON object"),
    Case("text/plain body from a browser", raw=b'{"prompt": "hi"}',
         headers={"content-type": "text/plain;charset=UTF-8", "origin": "http://evil.example"},
         message="must be a JSON object"),
    Case("an XML body", raw=b'{"prompt": "hi"}', headers={"content-type": "application/xml"},
         message="must be a JSON object"),
    Case("invalid UTF-8", raw=b'{"prompt": "caf\xc3\x28 \xff\xfe"}', message="not valid UTF-8"),
    # valid JSON, but half a UTF-16 pair is no Unicode text: the tokenizer cannot take it (was a 500)
    Case("lone surrogate in a prompt", raw=b'{"prompt": "hi \\ud800 there"}', message="not valid Unicode",
         param="prompt"),
    Case("lone surrogate in a message", raw=b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
         path="/v1/chat/completions", message="lone surrogate, U+DFFF", param="messages"),
    Case("form-encoded body from a browser", raw=b'{"prompt": "hi"}',
         headers={"content-type": "application/x-www-form-urlencoded", "origin": "http://evil.example"},
         message="must be a JSON object"),
    Case("wrong type: max_tokens", {"prompt": "hi", "max_tokens": "many"}, message="max_tokens", param="max_tokens"),
    Case("wrong type: prompt", {"prompt": 5}, message="prompt", param="prompt"),
    Case("wrong type: n", {"prompt": "hi", "n": [2]}, message="n: ", param="n"),
    Case("wrong type: messages", {"messages": "hi"}, path="/v1/chat/completions", message="messages",
         param="messages"),
    Case("unknown field", {"prompt": "hi", "frobnicate": 1}, message="frobnicate: unknown field", param="frobnicate"),
    Case("negative max_tokens", {"prompt": "hi", "max_tokens": -1}, message="max_tokens must be at least 1",
         param="max_tokens"),
    Case("zero max_tokens", {"prompt": "hi", "max_tokens": 0}, message="max_tokens must be at least 1",
         param="max_tokens"),
    Case("huge max_tokens", {"prompt": "hi", "max_tokens": 10**12},
         message=f"maximum context length is {MAX_MODEL_LEN} tokens"),
    Case("astronomic max_tokens", {"prompt": "hi", "max_tokens": 10**40},
         message=f"maximum context length is {MAX_MODEL_LEN} tokens"),
    Case("empty prompt", {"prompt": ""}, message="the prompt is empty", param="prompt"),
    Case("empty prompt list", {"prompt": []}, message="prompt must not be empty", param="prompt"),
    Case("65 prompts", {"prompt": ["hi"] * 65, "max_tokens": 1}, message="at most 64 are allowed", param="prompt"),
    Case("n=0", {"prompt": "hi", "n": 0}, message="n must be between 1 and 16", param="n"),
    Case("n=17", {"prompt": "hi", "n": 17}, message="n must be between 1 and 16", param="n"),
    Case("temperature -1", {"prompt": "hi", "temperature": -1}, message="temperature must be between 0 and 100",
         param="temperature"),
    Case("temperature NaN", raw=b'{"prompt": "hi", "temperature": NaN}', message="temperature",
         param="temperature"),
    Case("top_p 1.5", {"prompt": "hi", "top_p": 1.5}, message="top_p must be in (0, 1]", param="top_p"),
    Case("logit_bias out of vocabulary", {"prompt": "hi", "logit_bias": {str(VOCAB): 5}},
         message=f"token id {VOCAB} is out of range [0, {VOCAB})", param="logit_bias"),
    Case("logit_bias not a token id", {"prompt": "hi", "logit_bias": {"hello": 5}},
         message="keys must be token ids", param="logit_bias"),
    Case("logit_bias 1025 entries", {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(1025)}},
         message="at most 1024 are allowed", param="logit_bias"),
    Case("logit_bias value 500", {"prompt": "hi", "logit_bias": {"1": 500}}, message="[-100, 100]",
         param="logit_bias"),
    Case("10,000 stop strings", {"prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]},
         message="has 10000 strings; at most 64 are allowed", param="stop"),
    Case("stop string too long", {"prompt": "hi", "stop": "x" * 513}, message="at most 512 characters",
         param="stop"),
    Case("1025 stop token ids", {"prompt": "hi", "stop_token_ids": list(range(1025))},
         message="at most 1024 are allowed", param="stop_token_ids"),
    Case("logprobs 21", {"prompt": "hi", "logprobs": 21}, message="logprobs must be between 0 and 20",
         param="logprobs"),
    Case("top_logprobs 21", _chat(logprobs=True, top_logprobs=21), path="/v1/chat/completions",
         message="top_logprobs must be between 0 and 20", param="top_logprobs"),
    Case("seed past 64 bits", {"prompt": "hi", "seed": 2**64}, message="seed", param="seed"),
    Case("token ids out of range", {"prompt": [1, 2, VOCAB]}, message=f"prompt token id {VOCAB} is out of range",
         param="prompt"),
    Case("negative token id", {"prompt": [[5, -1]]}, message="prompt token id -1 is out of range", param="prompt"),
    Case("chat with no messages", {"messages": []}, path="/v1/chat/completions", message="messages must not be empty",
         param="messages"),
    Case("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, path="/v1/chat/completions",
         message="messages[0].role", param="messages[0].role"),
    Case("image content part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         path="/v1/chat/completions", message="only text content parts", param="messages[0].content[0].type"),
    Case("text part without text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
         path="/v1/chat/completions", message="a text part needs its `text`", param="messages[0].content[0].text"),
    Case("verbosity", _chat(verbosity="low"), path="/v1/chat/completions", message="verbosity is not supported",
         param="verbosity"),
    Case("predicted output", _chat(prediction={"type": "content", "content": "hi"}), path="/v1/chat/completions",
         message="prediction is not supported", param="prediction"),
    Case("audio modality", _chat(modalities=["text", "audio"]), path="/v1/chat/completions",
         message="modalities[1]", param="modalities[1]"),
    Case("unknown model", {"prompt": "hi", "model": "gpt-9"}, status=404, message="`gpt-9` does not exist",
         param="model"),
    Case("detokenize out of range", {"tokens": [VOCAB]}, path="/detokenize", message="out of range",
         param="tokens"),
    Case("50 MB body", raw=b'{"prompt": "' + b"a" * (50 * 2**20) + b'"}', status=413,
         message=f"at most {LIMIT} bytes (--max-request-bytes)"),
]


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServerProcess]:
    # the default for a GGUF file on CPU (its blocks on ggml's kernels), which the shared servers do not use
    srv = ServerProcess("--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory", "64MiB",
                        "--quantization", "auto").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()


def assert_openai_error(r: httpx.Response, status: int, message: str, param: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert err["code"] == status and isinstance(err["type"], str) and err["type"]
    assert message in err["message"], err["message"]
    if param is not None:
        assert err["param"] == param, err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(small_server: ServerProcess, case: Case) -> None:
    before = rss_bytes(small_server.proc.pid)
    with httpx.Client(base_url=small_server.url, timeout=60) as client:
        if case.raw is not None:
            r = client.post(case.path, content=case.raw, headers=case.headers)
        else:
            r = client.post(case.path, json=case.body, headers=case.headers)
        assert_openai_error(r, case.status, case.message, case.param)
        assert client.get("/health").status_code == 200
    if case.status == 413:  # refused from its Content-Length: never read into memory
        assert rss_bytes(small_server.proc.pid) - before < 20 * 2**20


def test_chunked_50mb_body(small_server: ServerProcess) -> None:
    """Without a Content-Length the body is counted as it arrives and refused past the limit."""
    before = rss_bytes(small_server.proc.pid)
    num_sent = 0

    def body() -> Iterator[bytes]:
        nonlocal num_sent
        yield b'{"prompt": "'
        for _ in range(50):
            num_sent += 2**20
            yield b"a" * 2**20
        yield b'"}'

    r = httpx.post(f"{small_server.url}/v1/completions", content=body(), headers=JSON, timeout=60)
    assert_openai_error(r, 413, f"at most {LIMIT} bytes (--max-request-bytes)")
    assert rss_bytes(small_server.proc.pid) - before < 20 * 2**20


def _text_of_length(client: httpx.Client, num_tokens: int) -> str:
    """A text prompt of exactly `num_tokens` tokens, checked with /tokenize."""
    text = "hello" + " hello" * (num_tokens - 1)
    r = client.post("/tokenize", json={"prompt": text})
    assert r.json()["count"] == num_tokens, r.json()["count"]
    return text


def test_prompt_one_token_over_and_under_the_context(small_server: ServerProcess) -> None:
    with httpx.Client(base_url=small_server.url, timeout=60) as client:
        over = _text_of_length(client, MAX_MODEL_LEN + 1)
        r = client.post("/v1/completions", json={"prompt": over})
        assert_openai_error(r, 400, f"maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt "
                                    f"contains {MAX_MODEL_LEN + 1} input tokens")
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": over}]})
        assert_openai_error(r, 400, f"maximum context length is {MAX_MODEL_LEN} tokens")
        # exactly the context, plus one output token: one over
        full = _text_of_length(client, MAX_MODEL_LEN)
        r = client.post("/v1/completions", json={"prompt": full, "max_tokens": 1})
        assert_openai_error(r, 400, f"for a total of {MAX_MODEL_LEN + 1} tokens")
        # one under: fits, with room for exactly one token (max_tokens unset means "the rest of the context")
        under = _text_of_length(client, MAX_MODEL_LEN - 1)
        for body in ({"prompt": under, "max_tokens": 1}, {"prompt": under}):
            r = client.post("/v1/completions", json={**body, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"] == {"prompt_tokens": MAX_MODEL_LEN - 1, "completion_tokens": 1,
                                         "total_tokens": MAX_MODEL_LEN}
        r = client.post("/v1/completions", json={"prompt": [7] * (MAX_MODEL_LEN - 1), "max_tokens": 2})
        assert_openai_error(r, 400, f"for a total of {MAX_MODEL_LEN + 1} tokens")


def test_curl_style_form_encoded_json_is_read_as_json(small_server: ServerProcess) -> None:
    """`curl -d '{...}'` without -H sends application/x-www-form-urlencoded; Ollama's and llama-server's
    documented examples rely on those servers reading it as JSON, so this one does too; as it does a body with no
    Content-Type (Python's `requests.post(url, data=json.dumps(body))`) or text/plain. Without an Origin header:
    not a browser, whose such posts stay refused (see the cases above)."""
    with httpx.Client(base_url=small_server.url, timeout=60) as client:
        for ctype in ("application/x-www-form-urlencoded", None, "text/plain;charset=UTF-8"):
            headers = {"content-type": ctype} if ctype else {}
            r = client.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}', headers=headers)
            assert r.status_code == 200, (ctype, r.text)
            assert r.json()["usage"]["completion_tokens"] == 2
            body = b'{"model": "SmolLM2-135M-Instruct", "prompt": "hi", "stream": false, "options": {"num_predict": 2}}'
            r = client.post("/api/generate", content=body, headers=headers)
            assert r.status_code == 200, (ctype, r.text)
            assert r.json()["done"] is True and r.json()["eval_count"] == 2