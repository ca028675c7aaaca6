"""build_app: the protocol-neutral app factory. Front ends come in as routers.

    build_app(models, config, routers=[openai.router.build_router, ...])
        models: a ModelPool (model_pool.py), or one AsyncEngine (a pool of that one model, loaded)
        state (ServerState), metrics (ServerMetrics: every model's, one registry; a step hook per engine)
        error handlers (the server's error shape, or the one a router registers for its paths in ErrorShapes)
        /health, /version, /metrics
        each router factory(ServerContext) -> APIRouter, mounted in order
        middleware, outermost first: CORS, API key (all but /health, /metrics and the routers'
        public_paths), body-size limit

All state lives on the app it returns (no module globals), so a test can build several apps around
engines of its own. Routers reach a model through `ctx.pool` (lease it for each request) and keep their
per-model objects on the LoadedModel (`model.serving(key, make)`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict

from tokenmill.engine.async_engine import AsyncEngine
from tokenmill.entrypoints.server.admission import ServerState
from tokenmill.entrypoints.server.config import ServerConfig
from tokenmill.entrypoints.server.errors import ErrorResponse, ErrorShapes, error_response, install_error_handlers
from tokenmill.entrypoints.server.middleware import (APIKeyMiddleware, BodySizeLimitMiddleware, CORSDisabledMiddleware,
                                                     FormBodyAsJSONMiddleware)
from tokenmill.entrypoints.server.loaded_model import LoadedModel
from tokenmill.entrypoints.server.model_pool import ModelPool
from tokenmill.metrics import ServerMetrics
from tokenmill.version import __version__

log = logging.getLogger("tokenmill.server")

# documented on every route; a route adds its own
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": desc}
    for code, desc in ((400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
                       (408, "Past --request-timeout: aborted"), (413, "Body larger than --max-request-bytes"),
                       (500, "The request failed"), (503, "Draining, loading, or too many waiting requests"))
}


class VersionResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str


@dataclass(frozen=True)
class ServerContext:
    """What a front end's router is built from: the models, the config, and the app's shared parts."""

    pool: ModelPool
    config: ServerConfig
    served_model_name: str  # the default model's name (config.served_model_name, or the model's own)
    state: ServerState
    metrics: ServerMetrics
    error_shapes: ErrorShapes  # a router with an error shape of its own registers its path prefix here
    # paths a router serves without the API key (a page and its assets, which a browser loads before it can
    # send a key); routers add to it while they are built, and build_app exempts them from --api-key
    public_paths: set[str] = field(default_factory=set)
    # path prefixes whose clients send the API key as `x-api-key` (Anthropic's): accepted there beside Bearer
    x_api_key_paths: set[str] = field(default_factory=set)


RouterFactory = Callable[[ServerContext], APIRouter]


def build_app(models: AsyncEngine | ModelPool, config: ServerConfig | None = None, *,
              routers: Sequence[RouterFactory] = (), state: ServerState | None = None,
              description: str = "An LLM inference server.") -> FastAPI:
    """The app serving `models` with `routers` mounted. Registers its metrics hook on every engine.

    One AsyncEngine is served as `config.served_model_name` (or its model's name) and kept loaded unless
    `config.keep_alive` or a request says otherwise. `state`: the lifecycle flags to share with the process
    (run_server drains through them); by default the app is ready at once."""
    config = config if config is not None else ServerConfig()
    if isinstance(models, ModelPool):
        pool = models
    else:
        pool = ModelPool.of_engine(models, config.served_model_name or models.engine.model_name,
                                   keep_alive=config.keep_alive_seconds(num_models=1),
                                   extra_names=config.served_model_aliases)
    state = state if state is not None else ServerState(is_ready=True)
    metrics = ServerMetrics(log_requests=config.log_requests, prefix=config.metrics_prefix,
                            engines=lambda: [(m.name, m.async_engine.stats()) for m in pool.loaded])

    def hook_metrics(model: LoadedModel) -> None:
        model.async_engine.step_hooks.append(metrics.model(model.name).on_step)

    pool.on_load(hook_metrics)
    shapes = ErrorShapes()
    context = ServerContext(pool, config, pool.default_name, state, metrics, shapes)

    app = FastAPI(title="tokenmill", version=__version__, responses=_ERRORS, description=description)
    app.state.server_state = state
    app.state.metrics = metrics
    install_error_handlers(app, shapes)

    @app.get("/health", response_class=Response, responses={200: {"description": "Ready (empty body)"},
                                                            503: {"model": ErrorResponse}})
    async def health() -> Response:
        """200 when ready; 503 while loading, draining, or if an engine has died."""
        dead = pool.dead_engine()
        if dead is not None:
            return error_response(503, f"the engine has stopped: {dead.dead_reason}")
        if not state.is_ready or state.is_draining:
            return error_response(503, "draining" if state.is_draining else "loading")
        return Response(status_code=200)

    # vLLM's alias of /health for platforms that probe /ping (SageMaker sends GET and POST)
    app.add_api_route("/ping", health, methods=["GET", "POST"], include_in_schema=False)

    @app.get("/load", include_in_schema=False)
    async def load() -> dict[str, int]:
        """vLLM's load probe for routers and load balancers: the requests being served now (admitted, not yet
        answered), over every model."""
        return {"server_load": len(state.in_flight)}

    @app.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    @app.head("/metrics", include_in_schema=False)  # probes (load balancers, scrapers' checks)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    for make_router in routers:
        app.include_router(make_router(context))

    # each add_middleware wraps the ones before it
    app.add_middleware(FormBodyAsJSONMiddleware)  # innermost: only the content type the app parses changes
    if config.max_request_bytes is not None:
        app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_request_bytes, shapes=shapes)
    if config.api_key:
        exempt = {"/health", "/ping", "/load"} | (set() if config.metrics_require_key else {"/metrics"}) | context.public_paths
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key, exempt=frozenset(exempt), shapes=shapes,
                           x_api_key_paths=tuple(context.x_api_key_paths))
    if config.cors_origins:  # added last: outermost, so preflights are answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=True)
    else:  # preflights get a 403 naming --cors-origins
        app.add_middleware(CORSDisabledMiddleware, shapes=shapes)
    return app
