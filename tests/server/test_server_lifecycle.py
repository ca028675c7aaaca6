"""Process lifecycle: engine death exits non-zero; SIGTERM drains and exits 0; queue limit answers 503."""

from __future__ import annotations

import signal
import threading
import time

import httpx
from server_process import ServerProcess


def test_engine_fault_exits_nonzero() -> None:
    srv = ServerProcess(env={"TOKENMILL_FAULT_AFTER_STEPS": "3"}).wait_ready()
    try:
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 20, "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
        srv.proc.wait(timeout=15)
        assert srv.proc.returncode not in (0, None), srv.output()
        assert "engine died" in srv.output()
    finally:
        srv.stop()


def test_queue_limit_then_graceful_drain() -> None:
    srv = ServerProcess("--max-num-seqs", "1", "--max-waiting-requests", "1", "--shutdown-timeout", "3").wait_ready()
    long = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    results: dict[str, bytes] = {}

    def stream(name: str) -> None:
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=long, timeout=60) as r:
            results[name] = b"".join(r.iter_raw())

    try:
        threads = [threading.Thread(target=stream, args=(n,)) for n in ("a", "b")]
        for t in threads:  # one runs, one waits
            t.start()
            time.sleep(0.5)
        over = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
        assert over.status_code == 503 and over.headers["retry-after"] == "1", over.text
        short = threading.Thread(target=lambda: results.setdefault("short", httpx.post(
            f"{srv.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30).content))
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 503  # draining
        assert httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Hi"}, timeout=5).status_code == 503
        short.start()
        for t in threads:
            t.join(30)
        short.join(30)
        assert srv.proc.wait(timeout=30) == 0, srv.output()
        for name in ("a", "b"):  # cut off by the shutdown timeout: a clean error event, then [DONE]
            raw = results[name]
            assert raw.endswith(b"data: [DONE]\n\n")
            assert b"shutting down" in raw.rsplit(b"\n\n", 3)[-3]
    finally:
        srv.stop()
