"""The server process: `run_server(config, models, routers)`.

`models` is one EngineConfig, or (name, EngineConfig) pairs for several (served_model.py names them). Each
model's header and memory plan are read first (a model that is missing or cannot work stops the start);
the port is bound and answers 503 while the default model loads; /health turns 200 once the app is
installed. The other models load on their first request (model_pool.py). SIGTERM/SIGINT start a drain:
/health and new requests get 503, in-flight requests may finish for up to `shutdown_timeout` seconds, the
rest are aborted in whichever engine runs them (clients get a 503 error), then every engine stops and the
process exits 0. A second signal aborts what is still in flight (its clients get the error) and exits at
once. If any engine thread dies, or hangs past `watchdog_timeout` while it has work (each AsyncEngine has its
watchdog), the process logs why and exits 1 within seconds.

Test hook: TOKENMILL_FAULT_AFTER_STEPS=N makes the engine loop raise after N steps (an injected fault, used
by the test that checks the server exits non-zero when its engine dies).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenmill.config import EngineConfig, format_size
from tokenmill.engine.async_engine import AsyncEngine
from tokenmill.entrypoints.server.admission import ServerState
from tokenmill.entrypoints.server.app import RouterFactory, build_app
from tokenmill.entrypoints.server.config import ServerConfig
from tokenmill.entrypoints.server.errors import error_response
from tokenmill.entrypoints.server.model_pool import ModelPool
from tokenmill.entrypoints.server.served_model import ServedModel
from tokenmill.loader.model_source import resolve_model
from tokenmill.memory_plan import RUNTIME_BYTES, CacheTooSmallError, available_ram

if TYPE_CHECKING:
    from tokenmill.engine.llm_engine import LLMEngine

log = logging.getLogger("tokenmill.server")


class _LoadingGate:
    """The ASGI app uvicorn serves: 503 for everything until the real app is installed."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await error_response(503, "the model is loading")(scope, receive, send)


class _Server(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains instead of stopping; the second stops at once (its
    in-flight requests aborted first, so that each client gets its error instead of a cut connection)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.on_first_signal: Any = None  # set once the app is up
        self.on_second_signal: Any = None
        self.num_signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # runs in the main thread
        self.num_signals += 1
        if self.num_signals == 1 and self.on_first_signal is not None:
            log.info("got %s: draining", signal.Signals(sig).name)
            self.on_first_signal()
        elif self.num_signals == 2 and self.on_second_signal is not None:
            log.warning("got %s again: aborting the in-flight requests and exiting now", signal.Signals(sig).name)
            self.on_second_signal()
        else:
            self.should_exit = True
            self.force_exit = self.num_signals > 1


def _endpoints(app: Any, base: str) -> str:
    """One line naming where each API the app serves lives, for the operator's first look."""
    paths: set[str] = set()

    def collect(routes: Any) -> None:  # an included router is one route wrapping its own (FastAPI >= 0.12x)
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                collect(inner.routes)
            else:
                paths.add(getattr(r, "path", ""))
    collect(app.routes)
    parts = [(f"OpenAI {base}/v1 (chat/completions, completions, responses, models)", "/v1/chat/completions"),
             (f"Anthropic {base}/v1/messages", "/v1/messages"), (f"Ollama {base}/api", "/api/chat"),
             (f"chat page {base}/", "/"), (f"metrics {base}/metrics", "/metrics")]
    return "endpoints: " + "; ".join(text for text, path in parts if path in paths)


async def _drain(server: _Server, pool: ModelPool, state: ServerState, timeout: float) -> None:
    """Stop admitting, let in-flight requests finish for up to `timeout` s, abort the rest, stop uvicorn."""
    state.is_draining = True
    deadline = time.monotonic() + timeout
    if state.in_flight:
        log.info("waiting up to %.0fs for %d in-flight requests", timeout, len(state.in_flight))
    while state.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.in_flight:
        log.warning("shutdown timeout: aborting %d requests", len(state.in_flight))
        await _abort_in_flight(pool, state, 2.0)
    server.should_exit = True


async def _abort_in_flight(pool: ModelPool, state: ServerState, wait: float) -> None:
    """Abort every in-flight request ("server shutting down") and give their error responses up to `wait`
    seconds to go out."""
    for rid in list(state.in_flight):
        pool.abort(rid, "server shutting down")
    end = time.monotonic() + wait
    while state.in_flight and time.monotonic() < end:
        await asyncio.sleep(0.02)


async def _stop_now(server: _Server, pool: ModelPool, state: ServerState) -> None:
    """A second signal: abort what is in flight, give the error responses a moment to go out, then stop."""
    state.is_draining = True
    await _abort_in_flight(pool, state, 1.0)
    server.should_exit = True
    server.force_exit = True


def _install_fault_injection(async_engine: AsyncEngine) -> None:
    """TOKENMILL_FAULT_AFTER_STEPS=N: the engine loop raises after N steps (tests of engine death)."""
    value = os.environ.get("TOKENMILL_FAULT_AFTER_STEPS")
    if not value:
        return
    limit, num_steps = int(value), [0]

    def hook(_: object) -> None:
        num_steps[0] += 1
        if num_steps[0] > limit:
            raise RuntimeError(f"injected fault after {limit} engine steps (TOKENMILL_FAULT_AFTER_STEPS)")

    async_engine.step_hooks.insert(0, hook)
    log.warning("fault injection armed: the engine will fail after %d steps", limit)


ModelConfigs = EngineConfig | Sequence[tuple[str, EngineConfig]]


def run_server(config: ServerConfig, models: ModelConfigs, routers: Sequence[RouterFactory],
               description: str = "An LLM inference server.") -> int:
    """Serve `routers` until a signal (exit 0) or engine death or stall (exit 1). Returns the exit code."""
    return asyncio.run(_serve(config, models, routers, description))


async def _start_pool(config: ServerConfig, models: ModelConfigs,
                      make_engine: Callable[[EngineConfig], AsyncEngine]) -> tuple[ModelPool, LLMEngine]:
    """The pool, its default model loaded. One model (without --models-memory) loads as it always has: its
    engine runs the memory plan and refuses what cannot work. Several are planned from their headers first,
    so that any model that cannot work stops the start, and the default must fit in the budget (the RAM
    available now, less the process's own, unless --models-memory says)."""
    named = [(config.served_model_name or resolve_model(models.model).name, models)] \
        if isinstance(models, EngineConfig) else list(models)
    if len(named) == 1 and config.models_memory is None:
        name, engine_config = named[0]
        if config.default_model not in (None, name):
            raise ValueError(f"--default-model {config.default_model!r} is not the served model ({name})")
        async_engine = make_engine(engine_config)
        engine = await asyncio.to_thread(async_engine.wait_loaded)
        return ModelPool.of_engine(async_engine, name, config.keep_alive_seconds(1), make_engine,
                                   config.served_model_aliases), engine
    available = available_ram()  # before anything is loaded
    served = await asyncio.to_thread(lambda: [ServedModel.plan(n, c) for n, c in named])
    if len(served) == 1 and config.served_model_aliases:  # --served-model-name's further names
        served = [dataclasses.replace(served[0], extra_names=config.served_model_aliases)]
    budget = config.models_memory or max(available - RUNTIME_BYTES, 0)
    pool = ModelPool(served, default=config.default_model, budget_bytes=budget,
                     keep_alive=config.keep_alive_seconds(len(served)), make_engine=make_engine)
    default = pool.served(pool.default_name)
    if default.memory_bytes > budget:
        raise ValueError(f"the default model {default.name!r} needs {format_size(default.memory_bytes)} (weights "
                         f"and KV cache) but the models' budget is {format_size(budget)}: raise --models-memory")
    started = time.monotonic()
    async_engine = make_engine(default.engine_config)
    engine = await asyncio.to_thread(async_engine.wait_loaded)
    pool.adopt(pool.default_name, async_engine, time.monotonic() - started, engine.plan.total_bytes - RUNTIME_BYTES)
    return pool, engine


async def _serve(config: ServerConfig, models: ModelConfigs, routers: Sequence[RouterFactory],
                 description: str) -> int:
    from tokenmill.engine.llm_engine import LLMEngine

    loop = asyncio.get_running_loop()
    gate = _LoadingGate()
    uv_config = uvicorn.Config(gate, host=config.host, port=config.port, log_level=config.log_level,
                               access_log=config.access_log, lifespan="off", timeout_graceful_shutdown=5,
                               timeout_keep_alive=5)
    server = _Server(uv_config)
    serve_task = asyncio.create_task(server.serve())
    exit_code = 0

    def on_engine_death(exc: BaseException) -> None:  # engine thread (or the watchdog's)
        nonlocal exit_code
        exit_code = 1
        log.critical("the engine died (%s: %s); exiting", type(exc).__name__, exc)
        loop.call_soon_threadsafe(setattr, server, "should_exit", True)
        killer = threading.Timer(10.0, os._exit, (1,))  # if a graceful stop hangs, still exit non-zero
        killer.daemon = True
        killer.start()

    def make_engine(engine_config: EngineConfig) -> AsyncEngine:
        # the engine thread loads the model itself, so that one thread does all torch work (async_engine.py)
        async_engine = AsyncEngine(lambda: LLMEngine(engine_config, False), on_death=on_engine_death,
                                   watchdog_timeout=config.watchdog_timeout)
        _install_fault_injection(async_engine)
        return async_engine

    try:
        pool, engine = await _start_pool(config, models, make_engine)
    except Exception as e:  # noqa: BLE001 - a bad model or setting: say why and stop
        if isinstance(e, CacheTooSmallError):  # the memory plan's verdict, in `tokenmill plan`'s words
            log.error("memory plan: verdict: cannot work. %s", e)
        else:
            log.error("cannot start the engine: %s", e)
        server.should_exit = True
        await asyncio.gather(serve_task, return_exceptions=True)
        return 1
    if serve_task.done():  # a signal while loading, or uvicorn could not start (e.g. the port is taken)
        pool.shutdown()
        return 0 if server.num_signals else 1
    state = ServerState()
    gate.app = build_app(pool, config, routers=routers, state=state, description=description)
    server.on_first_signal = lambda: loop.call_soon_threadsafe(
        lambda: loop.create_task(_drain(server, pool, state, config.shutdown_timeout)))
    server.on_second_signal = lambda: loop.call_soon_threadsafe(
        lambda: loop.create_task(_stop_now(server, pool, state)))
    state.is_ready = True
    others = f"; also serving {', '.join(n for n in pool.names if n != pool.default_name)} (loaded on first use)" \
        if len(pool.names) > 1 else ""
    log.info("serving %s as %r on http://%s:%d%s%s", engine.describe(), pool.default_name, config.host, config.port,
             " (API key required)" if config.api_key else "", others)
    # the pool owns the engine from here: a reference held by this coroutine (which lives as long as the
    # server) would keep the weights and KV cache alive after the pool unloads the model (keep_alive)
    del engine
    log.info("%s", _endpoints(gate.app, f"http://{config.host}:{config.port}"))
    await serve_task
    if not pool.shutdown(timeout=5.0):
        # still inside a long step: leaving through the interpreter's exit would tear down torch's C++
        # runtime under the running thread (seen as SIGABRT, "terminate called without an active
        # exception"); every request has had its answer, so leave at once
        log.warning("the engine thread is still inside a step after the drain; exiting without waiting for it")
        logging.shutdown()
        os._exit(exit_code)
    if exit_code:
        log.error("exiting with status %d because the engine died", exit_code)
    return exit_code
