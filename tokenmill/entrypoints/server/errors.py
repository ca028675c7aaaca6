"""APIError and the handlers that give every failure the server's error shape, which is OpenAI's.

Every error body is `{"error": {"message", "type", "param", "code"}}` with `code` the HTTP status. Request
validation failures are 400 (not FastAPI's 422) and name the offending field in `param` and the message;
a ParamError from the input path is a 400 with its `field` as `param`. The middleware, the lifecycle and
the OpenAI routes all answer in this shape. A front end with a shape of its own (Ollama's `{"error": "..."}`)
registers it for its path prefix in the app's ErrorShapes: the handlers and the middleware then answer its
paths in that shape, with the same statuses and messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenmill.sampling_params import ParamError

log = logging.getLogger("tokenmill.server")

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
          405: "MethodNotAllowedError", 408: "RequestTimeoutError", 413: "RequestTooLargeError",
          429: "RateLimitError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorInfo


class APIError(Exception):
    """An error to send to the client as-is: status, message, and the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "APIError"), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


# (status, message, param) -> an error body
ErrorBody = Callable[[int, str, str | None], dict[str, Any]]


class ErrorShapes:
    """Which error body a request path gets: the longest registered prefix's, else OpenAI's (error_body)."""

    def __init__(self) -> None:
        self._by_prefix: list[tuple[str, ErrorBody]] = []

    def add(self, prefix: str, body: ErrorBody) -> None:
        self._by_prefix.append((prefix, body))
        self._by_prefix.sort(key=lambda item: -len(item[0]))

    def response(self, path: str, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
        body = next((b for prefix, b in self._by_prefix if path.startswith(prefix)), error_body)
        return JSONResponse(body(status, message, param), status_code=status, headers=headers)


def _field_path(loc: tuple[Any, ...]) -> str:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; pydantic's union-branch names dropped."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in ("str", "int", "function-after")):
            continue  # e.g. 'list[int]': which union branch pydantic tried, not a field
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first validation error as (message, field path)."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    field = _field_path(tuple(e.get("loc", ())))
    if e.get("type") == "extra_forbidden":
        return f"{field}: unknown field; this server does not support it", field
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('msg')}", None
    if e.get("type") == "missing" and not field:
        return "the request body is missing", None
    if not field and e.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object (sent with Content-Type: application/json)", None
    msg = str(e.get("msg", "invalid value"))
    return (f"{field}: {msg}" if field else msg), (field or None)


def install_error_handlers(app: FastAPI, shapes: ErrorShapes | None = None) -> None:
    """Route every exception type to a JSON error: OpenAI's shape, or the one `shapes` gives its path."""
    shapes = shapes or ErrorShapes()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return shapes.response(request.url.path, exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(ParamError)
    async def _param_error(request: Request, exc: ParamError) -> JSONResponse:  # a bad value no route made a 400
        return shapes.response(request.url.path, 400, exc.message, exc.field)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(exc)
        return shapes.response(request.url.path, 400, message, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "There was an error parsing the body"
            message = f"the request body is not valid UTF-8 JSON: {exc.__cause__}"
        return shapes.response(request.url.path, exc.status_code, message, None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request")
        return shapes.response(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")
