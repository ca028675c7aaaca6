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

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tokenmill.entrypoints.ollama.model_card import ModelCard
from tokenmill.entrypoints.ollama.protocol import (ChatRequest, ChatResponse, GenerateRequest, GenerateResponse,
                                                   ListedModel, OllamaErrorResponse, OllamaVersionResponse,
                                                   PsResponse, RunningModel, ShowRequest, ShowResponse, TagsResponse)
from tokenmill.entrypoints.ollama.options import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P
from tokenmill.entrypoints.ollama.serving import NDJSON, OllamaServing
from tokenmill.entrypoints.server.app import ServerContext
from tokenmill.entrypoints.server.errors import APIError, bad_request
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


def _registry_message(card: ModelCard, action: str) -> str:
    return (f"tokenmill does not {action} models: it has no model registry. It serves the model it was started "
            f"with ({card.name}): `tokenmill serve MODEL`, where MODEL is a .gguf file, an HF-style directory "
            "(config.json, *.safetensors, tokenizer files) or 'default'")


def _parameters(card: ModelCard) -> str:
    """/api/show `parameters`: the sampling defaults this server applies, in Modelfile's spelling."""
    return "\n".join(f"{k:<30} {v}" for k, v in (("temperature", DEFAULT_TEMPERATURE), ("top_k", DEFAULT_TOP_K),
                                                  ("top_p", DEFAULT_TOP_P), ("num_ctx", card.context_length)))


def _modelfile(card: ModelCard, path: str) -> str:
    lines = [f"# served by tokenmill {__version__}; the template is the model's own (Jinja)", f"FROM {path}",
             f'TEMPLATE """{card.template}"""']
    lines += [f"PARAMETER {line}" for line in _parameters(card).splitlines()]
    return "\n".join(lines) + "\n"


def build_router(ctx: ServerContext) -> APIRouter:
    """Ollama's routes over `ctx`'s engine, sharing the app's state, metrics and admission."""
    serving = OllamaServing(ctx)
    card = serving.card
    path = str(ctx.async_engine.engine.source.path)
    ctx.error_shapes.add("/api/", ollama_error_body)
    router = APIRouter(responses=_ERRORS, tags=["ollama"])

    @router.post("/api/generate", response_model=GenerateResponse, responses=_STREAM)
    async def generate(req: GenerateRequest, raw_request: Request) -> Response:
        """Complete a prompt; a stream (the default) is NDJSON."""
        return await serving.create_generate(req, raw_request)

    @router.post("/api/chat", response_model=ChatResponse, responses=_STREAM)
    async def chat(req: ChatRequest, raw_request: Request) -> Response:
        """Answer a conversation; a stream (the default) is NDJSON."""
        return await serving.create_chat(req, raw_request)

    @router.get("/api/tags")
    async def tags() -> TagsResponse:
        return TagsResponse(models=[ListedModel(name=card.name, model=card.name, modified_at=card.modified_at,
                                                size=card.size, digest=card.digest, details=card.details)])

    @router.get("/api/ps")
    async def ps() -> PsResponse:
        return PsResponse(models=[RunningModel(name=card.name, model=card.name, size=card.memory_bytes,
                                               digest=card.digest, details=card.details, expires_at=_NEVER,
                                               size_vram=card.memory_bytes if card.is_gpu else 0,
                                               context_length=card.context_length)])

    @router.post("/api/show")
    async def show(req: ShowRequest) -> ShowResponse:
        serving.check_ollama_model(req.model or req.name)
        return ShowResponse(license=card.license, modelfile=_modelfile(card, path), parameters=_parameters(card),
                            template=card.template, details=card.details, model_info=card.model_info(bool(req.verbose)),
                            capabilities=card.capabilities, modified_at=card.modified_at)

    @router.get("/api/version")
    async def version() -> OllamaVersionResponse:
        return OllamaVersionResponse(version=__version__)

    def refuse(action: str) -> Callable[[], Coroutine[Any, Any, Response]]:
        async def endpoint() -> Response:  # the body is never read
            raise APIError(501, _registry_message(card, action))
        return endpoint

    for route, methods, action in (("/api/pull", ["POST"], "pull"), ("/api/push", ["POST"], "push"),
                                   ("/api/create", ["POST"], "create"), ("/api/copy", ["POST"], "copy"),
                                   ("/api/delete", ["DELETE"], "delete"),
                                   ("/api/blobs/{digest}", ["HEAD", "POST"], "store blobs of")):
        router.add_api_route(route, refuse(action), methods=methods,
                             summary=f"{action.split()[0].title()} (no registry)",
                             responses={501: {"model": OllamaErrorResponse}})

    async def embeddings() -> Response:
        # as the OpenAI router's /v1/embeddings: a RAG front end hears why, not a bare 404
        raise bad_request(f"the model {card.name} does not support embeddings: tokenmill serves generative models "
                          "(generate and chat) only", "model")

    for route in ("/api/embed", "/api/embeddings"):
        router.add_api_route(route, embeddings, methods=["POST"], include_in_schema=False)
    return router
