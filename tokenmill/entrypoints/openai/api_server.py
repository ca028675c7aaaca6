"""The OpenAI-compatible server: the protocol-neutral app (server/) with the OpenAI router mounted.

`build_app(async_engine, **settings)` and `run_server(args, engine_config)` keep their signatures from
before the server split; new code builds a ServerConfig and calls `server.app.build_app` or
`server.lifecycle.run_server` with the routers it wants.
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI

from tokenmill.config import EngineConfig
from tokenmill.engine.async_engine import AsyncEngine
from tokenmill.entrypoints.openai.router import DESCRIPTION, build_router
from tokenmill.entrypoints.server import app as server_app
from tokenmill.entrypoints.server import lifecycle
from tokenmill.entrypoints.server.admission import ServerState
from tokenmill.entrypoints.server.config import DEFAULT_MAX_REQUEST_BYTES, ServerConfig

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "build_app", "run_server"]


def build_app(async_engine: AsyncEngine, *, served_model_name: str | None = None, api_key: str | None = None,
              max_waiting_requests: int | None = None, cors_origins: list[str] | None = None,
              metrics_require_key: bool = False, state: ServerState | None = None, log_requests: bool = True,
              max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES, request_timeout: float | None = None,
              log_prompts: bool = False, tool_call_parser: str = "auto", config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `async_engine` over the OpenAI routes. Registers its metrics hook on the engine.

    `max_request_bytes=None` lifts the body-size limit; `request_timeout` (seconds) aborts requests that run
    longer; `log_prompts` lets prompt text into the log (never otherwise); `tool_call_parser` names the format
    chat reads tool calls in ("auto": detected from the chat template). `config`, when given, is used
    instead of the other settings.
    """
    if config is None:
        config = ServerConfig(served_model_name=served_model_name, api_key=api_key,
                              metrics_require_key=metrics_require_key, cors_origins=tuple(cors_origins or ()),
                              max_waiting_requests=max_waiting_requests, max_request_bytes=max_request_bytes,
                              request_timeout=request_timeout, log_requests=log_requests, log_prompts=log_prompts,
                              tool_call_parser=tool_call_parser)
    return server_app.build_app(async_engine, config, routers=[build_router], state=state, description=DESCRIPTION)


def run_server(args: argparse.Namespace, config: EngineConfig) -> int:
    """Serve the OpenAI API with the `serve` flags until a signal (exit 0) or engine death (exit 1)."""
    return lifecycle.run_server(ServerConfig.from_args(args), config, [build_router], DESCRIPTION)
