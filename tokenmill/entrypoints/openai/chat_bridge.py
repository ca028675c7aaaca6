"""What the front ends that answer through chat share (serving_responses.py, anthropic/messages.py): their
request built as a chat completion request, a chat error's field named as their request names it, and the
chat stream's chunks read back as dicts to translate into their own events."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from tokenmill.entrypoints.openai.protocol import ChatCompletionRequest
from tokenmill.entrypoints.server.errors import bad_request


def renamed(param: str | None, names: Mapping[str, str], whole: frozenset[str] = frozenset()) -> str | None:
    """A chat field path (e.g. `max_completion_tokens`, `messages[2].content`) as the front end's request names
    it: its first part through `names`; a first part in `whole` stands for the whole field (its indices mean
    nothing in the other request)."""
    if param is None:
        return None
    head = param.split(".")[0].split("[")[0]
    if head not in names:
        return param
    return names[head] if head in whole else names[head] + param[len(head):]


def chat_request(body: dict[str, Any], names: Mapping[str, str], whole: frozenset[str] = frozenset()
                 ) -> ChatCompletionRequest:
    """`body` (chat's fields) validated as a chat completion request; what does not validate is a 400 naming
    the front end's field (`renamed`)."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise bad_request(f"{loc}: {err['msg']}", renamed(loc or None, names, whole)) from None


async def chat_chunks(stream: StreamingResponse) -> AsyncGenerator[dict[str, Any], None]:
    """Each `data:` chunk of a chat completion stream as a dict, in order, [DONE] left out; an error the stream
    carries comes as {"error": {...}}. Closing this closes the chat stream, which aborts its request."""
    async with contextlib.aclosing(stream.body_iterator) as frames:  # type: ignore[type-var]
        async for raw in frames:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            for line in text.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[6:])
