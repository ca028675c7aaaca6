"""ToolCallStream: a parser's answer sent as it forms, in OpenAI's streaming shape.

Each step re-parses the text so far (a parser is a pure function of its text) and sends what is new: the
content's new characters, a new call's header (index, id, name) with the arguments it has so far, and any
arguments added to the last call. The parser's invariant (base.py) makes every parse extend the one before,
so the pieces joined are exactly the non-streaming answer, `parse(text)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.entrypoints.openai.tool_parsers.base import ParsedOutput, ToolParser

log = logging.getLogger("tokenmill.server")


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call `index`: its first piece carries `id` and `name`; every piece, arguments text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class StreamDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


class ToolCallStream:
    """Feed it the text as it grows (`feed`), the last piece with `is_final`; `ids`: the calls' ids."""

    def __init__(self, parser: ToolParser, new_call_id: Callable[[], str]) -> None:
        self.parser = parser
        self.new_call_id = new_call_id
        self.text = ""
        self.ids: list[str] = []  # call index -> id
        self._content = ""  # the content sent so far
        self._arguments: list[str] = []  # call index -> its arguments sent so far

    @property
    def num_calls(self) -> int:
        return len(self.ids)

    def feed(self, delta_text: str, is_final: bool = False) -> StreamDelta:
        """The news in `delta_text`, appended to the text so far; `is_final`: the text is complete, and
        the news is all that `parse(text)` has beyond what was sent."""
        self.text += delta_text
        return self._advance(self.parser.parse(self.text, is_final))

    def _advance(self, now: ParsedOutput) -> StreamDelta:
        content = ""
        if now.content.startswith(self._content):
            content = now.content[len(self._content):]
            self._content = now.content
        else:  # a parser broke its invariant: send nothing rather than something wrong
            log.warning("tool parser %s: the content no longer extends what was streamed", self.parser.name)
        calls: list[ToolCallDelta] = []
        for i, call in enumerate(now.tool_calls):
            if i == len(self._arguments):
                self.ids.append(self.new_call_id())
                self._arguments.append(call.arguments)
                calls.append(ToolCallDelta(i, call.arguments, self.ids[i], call.name))
            elif call.arguments != self._arguments[i] and call.arguments.startswith(self._arguments[i]):
                calls.append(ToolCallDelta(i, call.arguments[len(self._arguments[i]):]))
                self._arguments[i] = call.arguments
        return StreamDelta(content, calls)
