"""Ollama's native routes, as one APIRouter: /api/generate, /api/chat, /api/tags, /api/show, /api/ps,
/api/version, and the registry routes (pull, push, create, copy, delete, blobs), which answer how tokenmill
gets its models. Routes only parse and delegate to OllamaServing.

Every error on these paths is Ollama's shape, `{"error": "..."}`, with the status the server's other routes
would give (400 bad request, 401 without the API key, 404 unknown model, 408 timeout, 413 body too large,
503 draining or full, ...): the router registers the shape for `/api/` in the app's ErrorShapes, so the
app's handlers and middleware answer in it. `GET /` and `HEAD /` are not here (the web page's router
answers them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tokenmill.entrypoints.ollama.model_card import ModelCard, ModelListing, ollama_name, timestamp
from tokenmill.entrypoints.ollama.protocol import (AssistantMessage, ChatRequest, ChatResponse, GenerateRequest, GenerateResponse,
                                                   ListedModel, OllamaErrorResponse, OllamaVersionResponse,
                                                   PsResponse, PullRequest, PullResponse, RunningModel, ShowRequest,
                                                   ShowResponse, TagsResponse)
from tokenmill.entrypoints.ollama.serving import NDJSON, OllamaServing, ollama_not_found
from tokenmill.entrypoints.server.app import ServerContext
from tokenmill.entrypoints.server.errors import APIError, bad_request
from tokenmill.entrypoints.server.loaded_model import Lease, LoadedModel
from tokenmill.entrypoints.server.model_pool import SERVER_KEEP_ALIVE, ServerKeepAlive, UnknownModelError
from tokenmill.entrypoints.server.served_model import parse_keep_alive
from tokenmill.version import __version__

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OllamaErrorResponse, "description": desc}
    for code, desc in ((400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
                       (408, "Past --request-timeout: aborted"), (413, "Body larger than --max-request-bytes"),
                       (500, "The request failed"), (501, "Needs a model registry"),
                       (503, "Draining, or too many waiting requests"))
}
_STREAM: dict[int | str, dict[str, Any]] = {200: {"content": {NDJSON: {"schema": {"type": "string"}}}}}
_NEVER = "2318-01-01T00:00:00Z"  # /api/ps expires_at of a model that is never unloaded


def ollama_error_body(status: int, message: str, param: str | None) -> dict[str, Any]:
    """Ollama's error body: the message alone (no type, param or code)."""
    return {"error": message}


def _registry_message(names: list[str], action: str) -> str:
    return (f"tokenmill does not {action} models: it has no model registry. It serves the models it was started "
            f"with ({', '.join(ollama_name(n) for n in names)}): `tokenmill serve MODEL [MODEL ...]` or "
            "`--models-dir DIR`, where a MODEL is a .gguf file, an HF-style directory (config.json, *.safetensors, "
            "tokenizer files) or 'default'")


def _parameters(card: ModelCard, defaults: dict[str, float | int]) -> str:
    """/api/show `parameters`: the sampling defaults this server applies (OptionsMapper.default_parameters:
    Ollama's, or the model's own), in Modelfile's spelling."""
    return "\n".join(f"{k:<30} {v}" for k, v in (*defaults.items(), ("num_ctx", card.context_length)))


def _modelfile(card: ModelCard, path: str, defaults: dict[str, float | int]) -> str:
    lines = [f"# served by tokenmill {__version__}; the template is the model's own (Jinja)", f"FROM {path}",
             f'TEMPLATE """{card.template}"""']
    lines += [f"PARAMETER {line}" for line in _parameters(card, defaults).splitlines()]
    return "\n".join(lines) + "\n"


def _keep_alive(value: str | float | None) -> float | None | ServerKeepAlive:
    """A request's keep_alive in seconds (None: never unload); absent: the server's. A bad one is a 400."""
    if value is None:
        return SERVER_KEEP_ALIVE
    try:
        return parse_keep_alive(value)
    except ValueError as e:
        raise bad_request(f"keep_alive: {e}", "keep_alive") from None


def build_router(ctx: ServerContext) -> APIRouter:
    """Ollama's routes over `ctx`'s models, sharing the app's state and metrics. Each request leases the model
    it names from the pool (its keep_alive applies once it is done); each model has its own OllamaServing."""
    pool = ctx.pool
    ctx.error_shapes.add("/api/", ollama_error_body)
    router = APIRouter(responses=_ERRORS, tags=["ollama"])
    listings: dict[str, ModelListing] = {}  # by served name: read from the files once

    def serving_of(m: LoadedModel) -> OllamaServing:
        return m.serving("ollama", lambda m: OllamaServing(ctx, m))

    def not_found(e: UnknownModelError) -> APIError:
        return ollama_not_found(e.requested)

    def listing(name: str) -> ModelListing:
        if name not in listings:
            served = pool.served(name)
            listings[name] = ModelListing.of(name, served.source, served.model_config)
        return listings[name]

    async def lease(model: str | None, keep_alive: str | float | None) -> tuple[Lease, bool]:
        """The request's model, leased: (lease, whether its keep-alive is 0)."""
        if not model:
            raise bad_request("model is required", "model")
        seconds = _keep_alive(keep_alive)
        return await pool.lease(model, not_found, seconds), seconds == 0

    def stops_an_unloaded_model(req: GenerateRequest | ChatRequest, is_empty: bool) -> bool:
        """An empty request with keep_alive 0 (`ollama stop`) for a model that is not loaded: nothing to
        load or unload (an unknown model is still a 404)."""
        if not is_empty or not req.model or req.keep_alive is None or _keep_alive(req.keep_alive) != 0:
            return False
        try:
            return pool.loaded_model(pool.resolve(req.model)) is None
        except UnknownModelError as e:
            raise not_found(e) from None

    @router.post("/api/generate", response_model=GenerateResponse, responses=_STREAM)
    async def generate(req: GenerateRequest, raw_request: Request) -> Response:
        """Complete a prompt; a stream (the default) is NDJSON."""
        if stops_an_unloaded_model(req, not req.prompt and not req.suffix):
            return JSONResponse(GenerateResponse(model=req.model, created_at=timestamp(), response="", done=True,
                                                 done_reason="unload").model_dump(exclude_none=True))
        held, is_unloading = await lease(req.model, req.keep_alive)
        return await held.answer(lambda m: serving_of(m).create_generate(req, raw_request, held.load_seconds,
                                                                         is_unloading))

    @router.post("/api/chat", response_model=ChatResponse, responses=_STREAM)
    async def chat(req: ChatRequest, raw_request: Request) -> Response:
        """Answer a conversation; a stream (the default) is NDJSON."""
        if stops_an_unloaded_model(req, not req.messages):
            return JSONResponse(ChatResponse(model=req.model, created_at=timestamp(), done=True, done_reason="unload",
                                             message=AssistantMessage(content="")).model_dump(exclude_none=True))
        held, is_unloading = await lease(req.model, req.keep_alive)
        return await held.answer(lambda m: serving_of(m).create_chat(req, raw_request, held.load_seconds,
                                                                     is_unloading))

    @router.api_route("/api/tags", methods=["GET", "HEAD"])
    async def tags() -> TagsResponse:
        """Every served model, loaded or not."""
        models = []
        for name in pool.names:
            x = await asyncio.to_thread(listing, name)
            models.append(ListedModel(name=x.name, model=x.name, modified_at=x.modified_at, size=x.size,
                                      digest=x.digest, details=x.details))
        return TagsResponse(models=models)

    @router.get("/api/ps")
    async def ps() -> PsResponse:
        """The loaded models: their memory, context, and when their keep-alive unloads them."""
        running = []
        for m in pool.loaded:
            card = serving_of(m).card
            expires = m.expires_at
            running.append(RunningModel(name=card.name, model=card.name, size=card.memory_bytes, digest=card.digest,
                                        details=card.details, size_vram=card.memory_bytes if card.is_gpu else 0,
                                        expires_at=_NEVER if expires is None else timestamp(expires),
                                        context_length=card.context_length))
        return PsResponse(models=running)

    @router.post("/api/show")
    async def show(req: ShowRequest) -> ShowResponse:
        """The model's details, template and metadata (it is loaded to read them, if it was not)."""
        held, _ = await lease(req.model or req.name, None)

        async def run(m: LoadedModel) -> ShowResponse:
            card, defaults = serving_of(m).card, serving_of(m).options.default_parameters()
            path = str(pool.served(m.name).source.path)
            return ShowResponse(license=card.license, modelfile=_modelfile(card, path, defaults),
                                parameters=_parameters(card, defaults),
                                template=card.template, details=card.details,
                                model_info=card.model_info(bool(req.verbose)),
                                # every model takes tools (its template's way or the fallback prompt); it
                                # thinks apart when the server reads reasoning (--reasoning-parser, harmony)
                                capabilities=[*card.capabilities, "tools",
                                              *(["thinking"] if serving_of(m).reads_thinking else [])],
                                modified_at=card.modified_at)
        return await held.answer(run)

    @router.api_route("/api/version", methods=["GET", "HEAD"])  # Ollama answers HEAD on both (health checks)
    async def version() -> OllamaVersionResponse:
        return OllamaVersionResponse(version=__version__)

    def refuse(action: str) -> Callable[[], Coroutine[Any, Any, Response]]:
        async def endpoint() -> Response:  # the body is never read
            raise APIError(501, _registry_message(pool.names, action))
        return endpoint

    @router.post("/api/pull", responses={**_ERRORS, **_STREAM}, summary="Pull: a served model is there already")
    async def pull(req: PullRequest) -> Response:
        """A served model answers Ollama's success at once (scripts pull before they chat); any other name a
        501 that says how tokenmill gets its models (it has no registry)."""
        requested = req.model or req.name
        if not requested:
            raise bad_request("model is required", "model")
        try:
            pool.resolve(requested)
        except UnknownModelError:
            raise APIError(501, _registry_message(pool.names, "pull")) from None
        done = PullResponse(status="success")
        if req.stream is False:
            return JSONResponse(done.model_dump())
        return Response(done.model_dump_json() + "\n", media_type=NDJSON)

    for route, methods, action in (("/api/push", ["POST"], "push"),
                                   ("/api/create", ["POST"], "create"), ("/api/copy", ["POST"], "copy"),
                                   ("/api/delete", ["DELETE"], "delete"),
                                   ("/api/blobs/{digest}", ["HEAD", "POST"], "store blobs of")):
        router.add_api_route(route, refuse(action), methods=methods,
                             summary=f"{action.split()[0].title()} (no registry)",
                             responses={501: {"model": OllamaErrorResponse}})

    async def embeddings() -> Response:
        # as the OpenAI router's /v1/embeddings: a RAG front end hears why, not a bare 404
        raise bad_request(f"the model {ollama_name(pool.default_name)} does not support embeddings: tokenmill serves generative models "
                          "(generate and chat) only", "model")

    for route in ("/api/embed", "/api/embeddings"):
        router.add_api_route(route, embeddings, methods=["POST"], include_in_schema=False)
    return router
