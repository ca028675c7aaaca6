"""The opt-in guards: --metrics-require-key, --log-prompts and --request-timeout (streams and not)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from server_process import ServerProcess

from tokenmill.benchmarks.soak import server_gauges

KEY = "guard-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
TIMEOUT_S = 2.0
LONG = {"prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True, "n": 2}  # far longer than 2 s


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerProcess]:
    srv = ServerProcess("--api-key", KEY, "--metrics-require-key", "--log-prompts", "--request-timeout",
                        str(TIMEOUT_S), "--max-model-len", "256", "--kv-cache-memory", "64MiB").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()


def _wait_idle(client: httpx.Client) -> dict[str, float]:
    deadline = time.monotonic() + 10
    while True:
        gauges = server_gauges(client.get("/metrics").text)
        if gauges["kv_cache_usage_perc"] == 0 and gauges["num_requests_running"] == 0 or time.monotonic() > deadline:
            return gauges
        time.sleep(0.05)


def test_metrics_require_key(guarded: ServerProcess) -> None:
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    r = httpx.get(f"{guarded.url}/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.get(f"{guarded.url}/metrics", headers=HEADERS).status_code == 200


def test_log_prompts_logs_them(guarded: ServerProcess) -> None:
    marker = f"okapi-{uuid.uuid4().hex}"
    with httpx.Client(base_url=guarded.url, headers=HEADERS, timeout=30) as client:
        assert client.post("/v1/completions", json={"prompt": marker, "max_tokens": 1}).status_code == 200
        chat = {"messages": [{"role": "user", "content": f"chat {marker}"}], "max_tokens": 1}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
    log = guarded.output()
    assert f"prompt: {marker}" in log and f"chat {marker}" in log


def test_request_timeout(guarded: ServerProcess) -> None:
    with httpx.Client(base_url=guarded.url, headers=HEADERS, timeout=30) as client:
        t0 = time.monotonic()
        r = client.post("/v1/completions", json=LONG)
        elapsed = time.monotonic() - t0
        assert r.status_code == 408, r.text
        err = r.json()["error"]
        assert err["code"] == 408 and "--request-timeout is 2s" in err["message"], err
        assert TIMEOUT_S <= elapsed < TIMEOUT_S + 3.0  # aborted at the deadline, not when done
        # a stream: the tokens so far, an error event, then [DONE]
        with client.stream("POST", "/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 200,
                                 "ignore_eos": True, "stream": True}) as s:
            assert s.status_code == 200
            frames = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert frames[-1] == "[DONE]"
        last = json.loads(frames[-2])
        assert last["error"]["code"] == 408 and "did not finish within 2s" in last["error"]["message"], last
        assert any(json.loads(f)["choices"][0]["delta"].get("content") for f in frames[1:-2])  # tokens came first
        # the aborted requests' blocks are back, and short requests still work
        assert _wait_idle(client)["kv_cache_usage_perc"] == 0
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert "timed out after 2s" in guarded.output()  # the request log says why they ended
