"""The server's ASGI guards, protocol-neutral. Outermost first (as build_app adds them): CORS; the API key
(constant-time compare; every route but the exempt ones needs it); the body-size limit (413 past the
limit, checked against Content-Length before anything is read, and counted as a chunked body arrives); a
non-browser client's body without a JSON content type (curl's form encoding, none, text/plain) read as the JSON it is.
Each answers in the error shape the app's ErrorShapes give the request's path.
"""

from __future__ import annotations

import hmac

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenmill.entrypoints.server.errors import ErrorShapes


class APIKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` (or, under `x_api_key_paths`, Anthropic's `x-api-key: <key>`);
    exempt paths (and CORS preflights) pass freely."""

    def __init__(self, app: ASGIApp, api_key: str, exempt: frozenset[str], shapes: ErrorShapes | None = None,
                 x_api_key_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_x = api_key.encode()
        self.exempt = exempt
        self.shapes = shapes or ErrorShapes()
        self.x_api_key_paths = x_api_key_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.exempt and scope["method"] != "OPTIONS":
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            ok = hmac.compare_digest(given, self.expected)
            if not ok and self.x_api_key_paths and scope["path"].startswith(self.x_api_key_paths):
                ok = hmac.compare_digest(headers.get(b"x-api-key", b""), self.expected_x)
            if not ok:
                await self.shapes.response(scope["path"], 401,
                                           "missing or wrong API key: send 'Authorization: Bearer <key>'")(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class FormBodyAsJSONMiddleware:
    """A POST body sent without a JSON content type by a client that is not a browser (no Origin header) is read
    as the JSON it is: `curl -d '{...}'` sends application/x-www-form-urlencoded (Ollama's and llama-server's
    documented examples, which those servers accept), Python's `requests.post(url, data=json.dumps(body))` sends
    no Content-Type, and some clients send text/plain. Ollama ignores the content type altogether. Requests with
    an Origin header (browsers) keep their content type, so a cross-origin page's no-preflight POST (form,
    text/plain, or a Blob with no type) is still refused as not JSON."""

    # none, and the types of a JSON text a browser may also send cross-origin without a preflight
    _READ_AS_JSON = frozenset({b"", b"application/x-www-form-urlencoded", b"text/plain"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = scope["headers"]
            ctype = next((v for k, v in headers if k == b"content-type"), b"")
            if (ctype.split(b";")[0].strip().lower() in self._READ_AS_JSON
                    and not any(k == b"origin" for k, _ in headers)):
                scope = dict(scope)
                scope["headers"] = [*((k, v) for k, v in headers if k != b"content-type"),
                                    (b"content-type", b"application/json")]
        await self.app(scope, receive, send)


class CORSDisabledMiddleware:
    """Without --cors-origins, a browser's CORS preflight gets a 403 that says how to allow its origin
    (instead of a bare 404/405 that a browser reports only as a failed fetch)."""

    def __init__(self, app: ASGIApp, shapes: ErrorShapes | None = None) -> None:
        self.app = app
        self.shapes = shapes or ErrorShapes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = dict(scope["headers"])
            if b"origin" in headers and b"access-control-request-method" in headers:
                origin = headers[b"origin"].decode("latin-1")
                message = (f"cross-origin requests are not enabled on this server (origin {origin}): start it "
                           f"with --cors-origins {origin} (a comma-separated list, or '*')")
                await self.shapes.response(scope["path"], 403, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` when a chunked body passes the limit; FastAPI re-raises HTTPExceptions as they are."""


class BodySizeLimitMiddleware:
    """413 in the server's error shape (for the path) for a body over `max_bytes`, never reading more than the limit.

    A Content-Length over the limit is refused before any of the body is read (uvicorn discards the rest as
    it arrives); a chunked body is counted as it is received and refused once it passes the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, shapes: ErrorShapes | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shapes = shapes or ErrorShapes()

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
            await self.shapes.response(scope["path"], 413, self.message(int(declared)))(scope, receive, send)
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
            await self.shapes.response(scope["path"], 413, str(e.detail))(scope, receive, send)
