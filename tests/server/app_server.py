"""AppServer: the OpenAI app around an engine in this process, served by uvicorn on a thread, on a free port.

For server tests where a subprocess adds nothing (no signals, exit codes or CLI flags under test): no
interpreter to start, and the test can reach the engine. The sockets are real, so streaming and client
disconnects really happen (httpx's ASGI transport would not emulate a hang-up). `output()` is what the
`tokenmill` loggers wrote since the server was built, like a ServerProcess's log.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from server_process import free_port

from tokenmill.config import EngineConfig
from tokenmill.engine.async_engine import AsyncEngine


class UvicornThread:
    """`app` served by uvicorn on a thread of this process, on a free port, until `stop()`."""

    def __init__(self, app: Any, output: Callable[[], str] = lambda: "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="off", timeout_keep_alive=5))
        self._thread = threading.Thread(target=self._server.run, name="test-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start:\n{output()}")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)


class AppServer:
    def __init__(self, config: EngineConfig, **app_options: Any) -> None:
        """Load `config` on the engine thread (as `tokenmill serve` does), then serve `build_app(engine,
        **app_options)` until `stop()`."""
        from tokenmill.engine.llm_engine import LLMEngine
        from tokenmill.entrypoints.openai.api_server import build_app

        self._log = io.StringIO()
        self._handler = logging.StreamHandler(self._log)
        self._handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._logger = logging.getLogger("tokenmill")
        self._old_level = self._logger.level
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.INFO)
        self.async_engine = AsyncEngine(lambda: LLMEngine(config, False))
        self.async_engine.wait_loaded()
        self.app = build_app(self.async_engine, **app_options)
        self.uvicorn = UvicornThread(self.app, self.output)
        self.port, self.url = self.uvicorn.port, self.uvicorn.url

    def output(self) -> str:
        return self._log.getvalue()

    def stop(self) -> None:
        """Stop uvicorn and the engine thread; the engine must not have died meanwhile."""
        self.uvicorn.stop()
        self.async_engine.shutdown()
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._old_level)
        assert not self.async_engine.is_dead, self.async_engine.dead_reason
