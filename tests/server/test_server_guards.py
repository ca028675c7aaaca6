"""The opt-in guards: --metrics-require-key, --log-prompts and --request-timeout (streams and not).

Nothing here depends on the machine's speed: the timeout is derived from a measured time to first token
(so a stream's first tokens arrive well before it), and the guarded server's engine sleeps after every
step (TOKENMILL_TEST_STEP_DELAY_S) so that the long requests cannot finish within it, however fast the CPU.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import API_KEY
from server_process import ServerProcess

from tokenmill.benchmarks.soak import server_gauges

KEY = "guard-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
STORY = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 200, "ignore_eos": True,
         "stream": True}
LONG = {"prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True, "n": 2}
NUM_STEPS_PER_TIMEOUT = 100  # the guarded engine sleeps TIMEOUT_S / 100 per step: 200 tokens take >= 2 timeouts


def _time_to_first_token(server: ServerProcess) -> float:
    """Seconds from sending STORY to its first content chunk, on the shared server (same model and dtype)."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as client:
        t0 = time.monotonic()
        with client.stream("POST", "/v1/chat/completions", json={**STORY, "max_tokens": 2}) as s:
            for line in s.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return time.monotonic() - t0
    raise AssertionError("the measuring request streamed no content")


@pytest.fixture(scope="module")
def timeout_s(server: ServerProcess) -> float:
    """2 s, or 20 times the slowest of three measured times to first token if that is longer (whole seconds)."""
    ttft = max(_time_to_first_token(server) for _ in range(3))
    return float(max(2, math.ceil(20 * ttft)))


@pytest.fixture(scope="module")
def guarded(timeout_s: float) -> Iterator[ServerProcess]:
    srv = ServerProcess("--api-key", KEY, "--metrics-require-key", "--log-prompts", "--request-timeout",
                        f"{timeout_s:g}", "--max-model-len", "256", "--kv-cache-memory", "64MiB",
                        env={"TOKENMILL_TEST_STEP_DELAY_S": str(timeout_s / NUM_STEPS_PER_TIMEOUT)}).wait_ready()
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


def test_request_timeout(guarded: ServerProcess, timeout_s: float) -> None:
    with httpx.Client(base_url=guarded.url, headers=HEADERS, timeout=30 + timeout_s) as client:
        t0 = time.monotonic()
        r = client.post("/v1/completions", json=LONG)
        elapsed = time.monotonic() - t0
        assert r.status_code == 408, r.text
        err = r.json()["error"]
        assert err["code"] == 408 and f"--request-timeout is {timeout_s:g}s" in err["message"], err
        assert timeout_s <= elapsed < timeout_s + 3.0  # aborted at the deadline, not when done
        # a stream: the tokens so far, an error event, then [DONE]
        with client.stream("POST", "/v1/chat/completions", json=STORY) as s:
            assert s.status_code == 200
            frames = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert frames[-1] == "[DONE]"
        last = json.loads(frames[-2])
        assert last["error"]["code"] == 408 and f"did not finish within {timeout_s:g}s" in last["error"]["message"], \
            last
        assert any(json.loads(f)["choices"][0]["delta"].get("content") for f in frames[1:-2])  # tokens came first
        # the aborted requests' blocks are back, and short requests still work
        assert _wait_idle(client)["kv_cache_usage_perc"] == 0
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert f"timed out after {timeout_s:g}s" in guarded.output()  # the request log says why they ended
