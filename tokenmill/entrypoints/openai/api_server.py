"""The OpenAI-compatible HTTP server: `build_app(async_engine)` and `run_server(args, config)`.

Routes only parse and delegate to the serving classes. `build_app` keeps all state on the app it returns
(no module globals), so a test can build several apps around engines of its own.

Lifecycle (`run_server`): the port is bound first and answers 503 while the model loads; /health turns
200 once the app is installed. SIGTERM/SIGINT start a drain: /health and new requests get 503, in-flight
requests may finish for up to --shutdown-timeout seconds, the rest are aborted (clients get a 503 error),
then the process exits 0. A second signal exits at once. If the engine thread dies, or hangs past
--watchdog-timeout while it has work (AsyncEngine's watchdog), the process logs why and exits 1 within
seconds.

Guards, outermost first: CORS; the API key (constant-time compare; every route but /health and /metrics
needs it, /metrics too with --metrics-require-key); the body-size limit (413 past --max-request-bytes,
checked against Content-Length before anything is read, and counted as a chunked body arrives).

Test hook: TOKENMILL_FAULT_AFTER_STEPS=N makes the engine loop raise after N steps (an injected fault, used
by the test that checks the server exits non-zero when its engine dies).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenmill.config import EngineConfig
from tokenmill.engine.async_engine import DEFAULT_WATCHDOG_TIMEOUT, AsyncEngine
from tokenmill.entrypoints.openai.errors import bad_request, error_response, install_error_handlers
from tokenmill.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                                   CompletionResponse, DetokenizeRequest, DetokenizeResponse,
                                                   ErrorResponse, ModelCard, ModelList, TokenizeRequest,
                                                   TokenizeResponse, VersionResponse)
from tokenmill.entrypoints.openai.serving_chat import OpenAIServingChat
from tokenmill.entrypoints.openai.serving_completion import OpenAIServingCompletion
from tokenmill.entrypoints.openai.serving_engine import ServerState
from tokenmill.memory_plan import CacheTooSmallError
from tokenmill.metrics import ServerMetrics
from tokenmill.version import __version__

log = logging.getLogger("tokenmill.server")

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a 128K-token prompt is ~1 MiB of JSON; 4 MiB leaves room, and no more

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": desc}
    for code, desc in ((400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
                       (408, "Past --request-timeout: aborted"), (413, "Body larger than --max-request-bytes"),
                       (500, "The request failed"), (503, "Draining, loading, or too many waiting requests"))
}
_STREAM: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}}


class APIKeyMiddleware:
    """401 unless `Authorization: Bearer <key>`; exempt paths (and CORS preflights) pass freely."""

    def __init__(self, app: ASGIApp, api_key: str, exempt: frozenset[str]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.exempt and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` when a chunked body passes the limit; FastAPI re-raises HTTPExceptions as they are."""


class BodySizeLimitMiddleware:
    """413 in OpenAI's error shape for a body over `max_bytes`, never reading more than the limit.

    A Content-Length over the limit is refused before any of the body is read (uvicorn discards the rest as
    it arrives); a chunked body is counted as it is received and refused once it passes the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def message(self, num_bytes: int | None) -> str:
        size = f"{num_bytes} bytes" if num_bytes is not None else "over the limit"
        return (f"the request body is {size}; this server accepts at most {self.max_bytes} bytes "
                "(--max-request-bytes)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, self.message(int(declared)))(scope, receive, send)
            return
        num_received = 0
        is_started = False

        async def limited_receive() -> Message:
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    raise _BodyTooLarge(413, self.message(None))
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal is_started
            is_started = is_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _BodyTooLarge as e:  # raised outside FastAPI's body parsing (no route read it): answer here
            if is_started:
                raise
            await error_response(413, str(e.detail))(scope, receive, send)


def build_app(async_engine: AsyncEngine, *, served_model_name: str | None = None, api_key: str | None = None,
              max_waiting_requests: int | None = None, cors_origins: list[str] | None = None,
              metrics_require_key: bool = False, state: ServerState | None = None, log_requests: bool = True,
              max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES, request_timeout: float | None = None,
              log_prompts: bool = False) -> FastAPI:
    """The FastAPI app serving `async_engine`. Registers its metrics hook on the engine.

    `max_request_bytes=None` lifts the body-size limit; `request_timeout` (seconds) aborts requests that run
    longer; `log_prompts` lets prompt text into the log (never otherwise).
    """
    engine = async_engine.engine
    name = served_model_name or engine.model_name
    state = state if state is not None else ServerState(is_ready=True)
    metrics = ServerMetrics(name, async_engine.stats, log_requests=log_requests)
    async_engine.step_hooks.append(metrics.on_step)
    options: dict[str, Any] = {"request_timeout": request_timeout, "log_prompts": log_prompts}
    completions = OpenAIServingCompletion(async_engine, name, metrics, state, max_waiting_requests, **options)
    chat = OpenAIServingChat(async_engine, name, metrics, state, max_waiting_requests, **options)
    template_problem = chat.check_template()
    if template_problem:
        log.error("%s", template_problem)
    created = int(time.time())

    app = FastAPI(title="tokenmill", version=__version__, responses=_ERRORS,
                  description="An OpenAI-compatible LLM inference server.")
    app.state.server_state = state
    app.state.metrics = metrics
    install_error_handlers(app)

    @app.get("/health", response_class=Response, responses={200: {"description": "Ready (empty body)"},
                                                            503: {"model": ErrorResponse}})
    async def health() -> Response:
        """200 when ready; 503 while loading, draining, or if the engine has died."""
        if async_engine.is_dead:
            return error_response(503, f"the engine has stopped: {async_engine.dead_reason}")
        if not state.is_ready or state.is_draining:
            return error_response(503, "draining" if state.is_draining else "loading")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=created, root=engine.model_name,
                                         max_model_len=engine.max_model_len)])

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        completions.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt and messages", "prompt")
        if req.messages is not None:
            ids = await chat.render(req.messages, req.add_generation_prompt is not False)
        else:
            ids = await completions.encode(req.prompt or "", req.add_special_tokens is not False)
        return TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len, tokens=ids)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> DetokenizeResponse:
        completions.check_model(req.model)
        vocab = completions.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"tokens: token id {bad} is out of range [0, {vocab})", "tokens")
        return DetokenizeResponse(prompt=await asyncio.to_thread(engine.tokenizer.decode, req.tokens))

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_STREAM)
    async def create_completion(req: CompletionRequest, raw_request: Request) -> Any:
        return await completions.create_completion(req, raw_request)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_STREAM)
    async def create_chat_completion(req: ChatCompletionRequest, raw_request: Request) -> Any:
        return await chat.create_chat_completion(req, raw_request)

    # each add_middleware wraps the ones before it
    if max_request_bytes is not None:
        app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes)
    if api_key:
        exempt = {"/health"} | (set() if metrics_require_key else {"/metrics"})
        app.add_middleware(APIKeyMiddleware, api_key=api_key, exempt=frozenset(exempt))
    if cors_origins:  # added last: outermost, so preflights are answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"], allow_headers=["*"],
                           allow_credentials=True)
    return app


# -- process lifecycle ---------------------------------------------------------------------------------------
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
    """uvicorn.Server whose first SIGTERM/SIGINT drains instead of stopping; the second stops at once."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.on_first_signal: Any = None  # set once the app is up
        self.num_signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # runs in the main thread
        self.num_signals += 1
        if self.num_signals == 1 and self.on_first_signal is not None:
            log.info("got %s: draining", signal.Signals(sig).name)
            self.on_first_signal()
        else:
            self.should_exit = True
            self.force_exit = self.num_signals > 1


async def _drain(server: _Server, async_engine: AsyncEngine, state: ServerState, timeout: float) -> None:
    """Stop admitting, let in-flight requests finish for up to `timeout` s, abort the rest, stop uvicorn."""
    state.is_draining = True
    deadline = time.monotonic() + timeout
    if state.in_flight:
        log.info("waiting up to %.0fs for %d in-flight requests", timeout, len(state.in_flight))
    while state.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.in_flight:
        log.warning("shutdown timeout: aborting %d requests", len(state.in_flight))
        for rid in list(state.in_flight):
            async_engine.abort(rid, "server shutting down")
        end = time.monotonic() + 2.0
        while state.in_flight and time.monotonic() < end:  # let their error responses go out
            await asyncio.sleep(0.05)
    server.should_exit = True


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


def run_server(args: argparse.Namespace, config: EngineConfig) -> int:
    """Serve until a signal (exit 0) or engine death (exit 1). Returns the exit code."""
    return asyncio.run(_serve(args, config))


async def _serve(args: argparse.Namespace, config: EngineConfig) -> int:
    from tokenmill.engine.llm_engine import LLMEngine

    loop = asyncio.get_running_loop()
    gate = _LoadingGate()
    uv_config = uvicorn.Config(gate, host=args.host, port=args.port, log_level=args.log_level,
                               access_log=args.access_log, lifespan="off", timeout_graceful_shutdown=5,
                               timeout_keep_alive=5)
    server = _Server(uv_config)
    serve_task = asyncio.create_task(server.serve())
    exit_code = 0

    def on_engine_death(exc: BaseException) -> None:  # engine thread
        nonlocal exit_code
        exit_code = 1
        log.critical("the engine died (%s: %s); exiting", type(exc).__name__, exc)
        loop.call_soon_threadsafe(setattr, server, "should_exit", True)
        killer = threading.Timer(10.0, os._exit, (1,))  # if a graceful stop hangs, still exit non-zero
        killer.daemon = True
        killer.start()

    # the engine thread loads the model itself, so that one thread does all torch work (async_engine.py)
    watchdog_timeout = getattr(args, "watchdog_timeout", None)  # None: the default; 0: no watchdog
    watchdog_timeout = DEFAULT_WATCHDOG_TIMEOUT if watchdog_timeout is None else watchdog_timeout or None
    async_engine = AsyncEngine(lambda: LLMEngine(config, False), on_death=on_engine_death,
                               watchdog_timeout=watchdog_timeout)
    try:
        engine = await asyncio.to_thread(async_engine.wait_loaded)
    except Exception as e:  # noqa: BLE001 - a bad model or setting: say why and stop
        if isinstance(e, CacheTooSmallError):  # the memory plan's verdict, in `tokenmill plan`'s words
            log.error("memory plan: verdict: cannot work. %s", e)
        else:
            log.error("cannot start the engine: %s", e)
        server.should_exit = True
        await asyncio.gather(serve_task, return_exceptions=True)
        return 1
    if serve_task.done():  # a signal while loading, or uvicorn could not start (e.g. the port is taken)
        async_engine.shutdown()
        return 0 if server.num_signals else 1
    _install_fault_injection(async_engine)
    state = ServerState()
    api_key = args.api_key or os.environ.get("TOKENMILL_API_KEY") or None
    cors = [o.strip() for o in args.cors_origins.split(",") if o.strip()] if args.cors_origins else None
    gate.app = build_app(async_engine, served_model_name=args.served_model_name, api_key=api_key,
                         max_waiting_requests=args.max_waiting_requests, cors_origins=cors,
                         metrics_require_key=args.metrics_require_key, state=state,
                         max_request_bytes=args.max_request_bytes or None, request_timeout=args.request_timeout,
                         log_prompts=args.log_prompts)
    server.on_first_signal = lambda: loop.call_soon_threadsafe(
        lambda: loop.create_task(_drain(server, async_engine, state, args.shutdown_timeout)))
    state.is_ready = True
    log.info("serving %s as %r on http://%s:%d%s", engine.describe(), args.served_model_name or engine.model_name,
             args.host, args.port, " (API key required)" if api_key else "")
    await serve_task
    async_engine.shutdown()
    if exit_code:
        log.error("exiting with status %d because the engine died", exit_code)
    return exit_code
