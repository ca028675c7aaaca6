"""ServerProcess: a real `tokenmill serve` process on a free port, for tests and for `tokenmill bench soak`.

The process runs `python -m tokenmill.cli serve --port <free port> <args>` with this
interpreter (so it imports the same `tokenmill`), its output going to a log file that `output()` reads.
`stop()` sends SIGTERM (the server drains, then exits 0) and kills it if it has not exited in time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """The resident set size of process `pid` (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class ServerProcess:
    def __init__(self, *serve_args: str, env: dict[str, str] | None = None, log_path: str | Path | None = None) -> None:
        """Start the server (without waiting for it: see `wait_ready`). `env` is added to this process's
        environment; `log_path` defaults to a new temporary file."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if log_path is None:
            with tempfile.NamedTemporaryFile(prefix="tokenmill-server-", suffix=".log", delete=False) as f:
                log_path = f.name
        self.log_path = Path(log_path)
        self.args = list(serve_args)
        cmd = [sys.executable, "-m", "tokenmill.cli", "serve", "--port", str(self.port), *serve_args]
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 300.0) -> ServerProcess:
        """Wait until /health answers 200; raise (with the log) if the process exits or `timeout` passes."""
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
        self.proc.kill()
        raise TimeoutError(f"server not healthy after {timeout:g}s:\n{self.output()}")

    def output(self) -> str:
        """Everything the server has logged so far."""
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to `timeout` s (then SIGKILL); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
