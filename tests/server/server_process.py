"""ServerProcess: a real `tokenmill serve` process for tests, started on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

MODEL_ARGS = ["--kv-cache-memory", "256MiB", "--max-model-len", "2048"]
# fp32 unless a test asks otherwise: HTTP outputs are compared exactly with the offline fp32 `llm` and
# across loads, which only fp32 guarantees (bf16 matmuls pick kernels by batch size; see test_bf16.py)
DEFAULT_DTYPE = ["--dtype", "float32"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *extra_args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tokenmill-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "tokenmill.entrypoints.cli", "serve", "--port", str(self.port), *MODEL_ARGS,
               *([] if "--dtype" in extra_args else DEFAULT_DTYPE), *extra_args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
