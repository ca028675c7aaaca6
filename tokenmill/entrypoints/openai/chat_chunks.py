"""The chat stream's chunks read back as dicts, for the front ends that answer through chat and translate its
stream into their own events (serving_responses.py, anthropic/messages.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from fastapi.responses import StreamingResponse


async def chat_chunks(stream: StreamingResponse) -> AsyncGenerator[dict[str, Any], None]:
    """Each `data:` chunk of a chat completion stream as a dict, in order, [DONE] left out; an error the stream
    carries comes as {"error": {...}}. Closing this closes the chat stream, which aborts its request."""
    async with contextlib.aclosing(stream.body_iterator) as frames:  # type: ignore[type-var]
        async for raw in frames:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            for line in text.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[6:])
