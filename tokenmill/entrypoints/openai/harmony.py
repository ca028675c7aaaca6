"""Harmony, gpt-oss's response format, read into reasoning, content and tool calls.

gpt-oss (its chat template ends the prompt with `<|start|>assistant`) answers in messages, each a header
and a body between control tokens:

    <|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4.<|return|>
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

(the recipient may also stand before the channel: `<|start|>assistant to=functions.f<|channel|>commentary
json<|message|>`). A message's header decides where its body goes:

    to=functions.NAME (any channel)   a tool call, its body the arguments (a JSON object), when the request
                                      offers NAME (ToolCalling.accepts) within its call limit; otherwise the
                                      body is text of its channel, as below
    analysis                          reasoning
    final, commentary (a preamble)    content
    no header, or another channel     content

Messages of one kind are joined by a newline. A message ends at <|end|>, <|return|> or <|call|> (the
last two end generation and never reach the text: they are end-of-generation tokens), at the next
<|start|> or <|channel|>, or where the text ends (an answer cut by max_tokens: the reasoning or content
written so far; a cut call's arguments do not parse, so they are content). A header never finished is
dropped. No marker ever reaches the reasoning or the content.

One state machine reads the whole text and a stream (the whole text is a stream of one delta), so a
streamed answer's pieces join to exactly what the non-streamed one returns: a marker split across deltas
is held back until it is whole, and a call is reported whole when its message ends (in practice the end
of the answer, since <|call|> stops generation).

The text must keep the markers, which are special tokens: requests read this way decode with
skip_special_tokens false; the request's own skip_special_tokens (true by default) then removes the
vocabulary's other special tokens from what the user sees (`Specials`).

On for a model whose chat template writes harmony's markers (decided once per model), and for vLLM's
`--reasoning-parser openai_gptoss` and `--tool-call-parser openai`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tokenmill.server")

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
MARKERS = (START, END, MESSAGE, CHANNEL, RETURN, CALL, CONSTRAIN)
REASONING_PARSER = "openai_gptoss"  # vLLM's --reasoning-parser name for this format
TOOL_PARSER = "openai"  # vLLM's --tool-call-parser name for it
FUNCTIONS = "functions."  # the namespace a harmony template declares the request's tools in

_OPENERS = (START, CHANNEL, MESSAGE)  # what may begin a message's header
_HEADER_END = re.compile("|".join(re.escape(m) for m in (MESSAGE, START, END, RETURN, CALL)))
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
# (function name, decoded arguments) -> whether the call is reported (ToolCalling.accepts)
CallCheck = Callable[[str, Any], bool]


def is_harmony_template(template: str | None) -> bool:
    """Whether a chat template writes harmony's headers (gpt-oss's do, in every GGUF and HF directory)."""
    return template is not None and CHANNEL in template and MESSAGE in template


def uses_harmony(template: str | None, reasoning_parser: str | None, tool_call_parser: str | None) -> bool:
    """Whether a model's answers are read as harmony: its template is harmony's, or a flag names the format."""
    return (is_harmony_template(template) or reasoning_parser == REASONING_PARSER
            or tool_call_parser == TOOL_PARSER)


class Specials:
    """The special-token texts a stream looks for: harmony's markers, which steer it, and `hidden` ones
    (the vocabulary's other special tokens), which are dropped from the text."""

    def __init__(self, hidden: Iterable[str] = ()) -> None:
        self.hidden = frozenset(hidden) - set(MARKERS) - {""}
        texts = sorted({*MARKERS, *self.hidden}, key=len, reverse=True)  # the longest match wins
        self.pattern = re.compile("|".join(re.escape(t) for t in texts))
        self.prefixes = frozenset(t[:n] for t in texts for n in range(1, len(t)))  # proper prefixes
        self.longest = len(texts[0])

    def held(self, text: str) -> int:
        """How many characters at the end of `text` may be the start of a special text (so must wait)."""
        for n in range(min(self.longest - 1, len(text)), 0, -1):
            if text[-n:] in self.prefixes:
                return n
        return 0


MARKERS_ONLY = Specials()


@dataclass(frozen=True)
class HarmonyCall:
    name: str
    arguments: str  # the arguments object as JSON text


@dataclass
class HarmonyDelta:
    """What one piece of text added: reasoning and content text, and the calls completed."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[HarmonyCall] = field(default_factory=list)


@dataclass(frozen=True)
class HarmonyAnswer:
    """A whole answer: its reasoning (None when it has none), content ("" if none) and calls."""

    reasoning: str | None
    content: str
    tool_calls: list[HarmonyCall]


class HarmonyStream:
    """feed(delta) -> HarmonyDelta; the deltas join to `parse`'s answer for the whole text."""

    def __init__(self, accept: CallCheck | None = None, max_calls: int | None = None,
                 specials: Specials = MARKERS_ONLY) -> None:
        """`accept`: which calls are reported (None: none, e.g. a request without tools); `max_calls`: how
        many at most (later ones are text); `specials`: the texts to look for (and which to drop)."""
        self.accept = accept
        self.max_calls = max_calls
        self.specials = specials
        self.num_calls = 0
        # "start": between messages (a header may begin); "header": reading one up to <|message|>; "body"
        self.state = "start"
        self.pending = ""  # text held back: a partial marker, or whitespace before a header
        self.header = ""  # the header so far (state "header")
        self.kind = "content"  # where the body goes: "reasoning", "content" or "call"
        self.channel: str | None = None
        self.recipient: str | None = None
        self.call_body = ""  # a call's arguments as written so far
        self.is_message_shown = False  # the current message has sent text (its separator is written)
        self.sent = {"reasoning": False, "content": False}  # text of that kind has been sent
        self.saw_marker = False

    def feed(self, text: str, is_final: bool = False, cut: bool = False) -> HarmonyDelta:
        """`cut`: the answer ended at max_tokens (with is_final): a call message still open then was never
        closed by <|call|>, so it is no call (its body is text)."""
        out = HarmonyDelta()
        buf = self.pending + text
        self.pending = ""
        is_waiting = False
        while not is_waiting:  # each state reads what it can, then hands the rest on or waits for more
            if self.state == "start":
                is_waiting, buf = self._start(buf, is_final)
            elif self.state == "header":
                is_waiting, buf = self._header(buf, is_final)
            else:
                is_waiting, buf = self._body(buf, is_final, out)
        if is_final and self.state == "body":
            self._end_message(out, cut)
        return out

    # -- the states: each returns (whether it waits for more text, the text left for the next state) -----
    def _start(self, buf: str, is_final: bool) -> tuple[bool, str]:
        body = buf.lstrip()
        for opener in _OPENERS:
            if body.startswith(opener):
                self.state, self.saw_marker = "header", True
                return False, body[len(START):] if opener == START else body
        if not is_final and (not body or any(o.startswith(body) for o in _OPENERS)):
            self.pending = buf  # whitespace, or an opener still arriving
            return True, ""
        if not body and self.saw_marker:  # whitespace after the last message is no message
            return True, ""
        self._open("")  # text without a header: content
        # the answer's first text stays as written; between messages, leading whitespace goes
        return False, body if self.saw_marker else buf

    def _header(self, buf: str, is_final: bool) -> tuple[bool, str]:
        searched = max(0, len(self.header) - self.specials.longest)
        self.header += buf
        m = _HEADER_END.search(self.header, searched)
        if m is None:
            if is_final:  # a header never finished: nothing to show
                self.header, self.state = "", "start"
            return True, ""
        head, rest = self.header[:m.start()], self.header[m.end():]
        self.header = ""
        if m.group() == MESSAGE:
            self._open(head)
        elif m.group() != START:  # <|end|> or the like: a message without a body
            self.state = "start"
        return False, rest  # (after <|start|>: a new header)

    def _body(self, buf: str, is_final: bool, out: HarmonyDelta) -> tuple[bool, str]:
        pos = 0
        while True:
            m = self.specials.pattern.search(buf, pos)
            if m is not None and not is_final and buf[m.start():] in self.specials.prefixes:
                m = None  # a longer special text may still be arriving
            if m is None:
                keep = 0 if is_final else self.specials.held(buf[pos:])
                self._text(buf[pos:len(buf) - keep], out)
                self.pending = buf[len(buf) - keep:]
                return True, ""
            self._text(buf[pos:m.start()], out)
            token, pos = m.group(), m.end()
            if token in (MESSAGE, CONSTRAIN) or token in self.specials.hidden:
                continue  # stray or hidden: dropped
            self.saw_marker = True
            self._end_message(out)
            if token == START:
                self.state = "header"
            elif token == CHANNEL:
                self.state, pos = "header", m.start()  # the channel is part of the next header
            else:
                self.state = "start"
            return False, buf[pos:]

    # -- messages --------------------------------------------------------------------------------------
    def _open(self, header: str) -> None:
        """Start a message's body, routed by its header (the module doc's table)."""
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        self.channel = channel.group(1) if channel else None
        self.recipient = recipient.group(1) if recipient else None
        self.kind = "call" if self.recipient is not None else self._channel_kind()
        self.call_body = ""
        self.is_message_shown = False
        self.state = "body"

    def _channel_kind(self) -> str:
        return "reasoning" if self.channel == "analysis" else "content"

    def _text(self, piece: str, out: HarmonyDelta) -> None:
        if not piece:
            return
        if self.kind == "call":
            self.call_body += piece
            return
        if not self.is_message_shown and self.sent[self.kind]:
            piece = "\n" + piece  # the next message of a kind already shown
        self.is_message_shown = self.sent[self.kind] = True
        if self.kind == "reasoning":
            out.reasoning += piece
        else:
            out.content += piece

    def _end_message(self, out: HarmonyDelta, cut: bool = False) -> None:
        if self.kind == "call":
            call = None if cut else self._call()
            if call is not None:
                out.tool_calls.append(call)
                self.num_calls += 1
            else:  # not a call this request may get: its body is text of its channel
                self.kind = self._channel_kind()
                self._text(self.call_body, out)
        self.kind, self.channel, self.recipient, self.call_body = "content", None, None, ""

    def _call(self) -> HarmonyCall | None:
        assert self.recipient is not None
        if self.accept is None or (self.max_calls is not None and self.num_calls >= self.max_calls):
            return None
        name = self.recipient.removeprefix(FUNCTIONS)
        try:
            arguments = json.loads(self.call_body.strip() or "{}")  # a function without arguments may write none
        except ValueError:
            return None
        if not isinstance(arguments, dict) or not name or not self.accept(name, arguments):
            return None
        return HarmonyCall(name, json.dumps(arguments, ensure_ascii=False))


def parse(text: str, accept: CallCheck | None = None, max_calls: int | None = None,
          specials: Specials = MARKERS_ONLY, cut: bool = False) -> HarmonyAnswer:
    """A whole answer's reasoning, content and calls (HarmonyStream's arguments; `cut`: it ended at
    max_tokens)."""
    d = HarmonyStream(accept, max_calls, specials).feed(text, is_final=True, cut=cut)
    return HarmonyAnswer(d.reasoning or None, d.content, d.tool_calls)


@dataclass(frozen=True)
class HarmonyReader:
    """How one request's answers are read: the calls it may get, and the special texts to look for."""

    accept: CallCheck | None
    max_calls: int | None
    specials: Specials

    def stream(self) -> HarmonyStream:
        return HarmonyStream(self.accept, self.max_calls, self.specials)

    def parse(self, text: str, cut: bool = False) -> HarmonyAnswer:
        return parse(text, self.accept, self.max_calls, self.specials, cut)


class Harmony:
    """One model's harmony reading (`of`: None for a model that does not speak it)."""

    def __init__(self, hidden: Iterable[str]) -> None:
        self.hiding = Specials(hidden)

    @classmethod
    def of(cls, tokenizer: Any, reasoning_parser: str | None, tool_call_parser: str | None,
           announce: bool = True) -> Harmony | None:
        """The reading for a model with this tokenizer (its chat template) and these flags; `announce`:
        log which case the model is in (the chat endpoint does, once per model)."""
        template = tokenizer.chat_template
        if not uses_harmony(template, reasoning_parser, tool_call_parser):
            return None
        if announce:
            if is_harmony_template(template):
                why = "its chat template writes harmony's messages"
            elif reasoning_parser == REASONING_PARSER:
                why = f"--reasoning-parser {reasoning_parser}"
            else:
                why = f"--tool-call-parser {tool_call_parser}"
            log.info("chat answers are read in gpt-oss's harmony format (%s): the analysis channel as reasoning, "
                     "the final channel as content, calls to functions.* as tool calls", why)
            if reasoning_parser not in (None, REASONING_PARSER):
                log.info("--reasoning-parser %s is not used for this model: harmony's analysis channel is its "
                         "reasoning", reasoning_parser)
        hidden = [tokenizer.token_text(i) for i in sorted(tokenizer.special_token_ids)]
        return cls(hidden)

    def reader(self, accept: CallCheck | None, max_calls: int | None, skip_special_tokens: bool) -> HarmonyReader:
        """A request's reader; `skip_special_tokens`: the request's (the vocabulary's other special tokens
        are dropped from the answer), while the text itself keeps them all for the markers' sake."""
        return HarmonyReader(accept, max_calls, self.hiding if skip_special_tokens else MARKERS_ONLY)


def harmony_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools as gpt-oss's own template can render them (copies): it concatenates a function's description and a
    parameter's default with strings, so a tool without a description (which OpenAI allows) or an enum / oneOf
    parameter with a non-string default made it fail. A missing description becomes "", such a default its
    JSON text."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        tool = json.loads(json.dumps(tool))
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        fn.setdefault("description", "")
        props = (fn.get("parameters") or {}).get("properties")
        for spec in (props.values() if isinstance(props, dict) else []):
            if (isinstance(spec, dict) and ("enum" in spec or "oneOf" in spec) and "default" in spec
                    and not isinstance(spec["default"], str)):
                spec["default"] = json.dumps(spec["default"])
        out.append(tool)
    return out


def harmony_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as harmony templates take it. An assistant turn with tool calls renders its reasoning as
    the analysis before the calls, and such templates refuse a turn that also has content (a preamble sent
    back as it came): its content then joins the reasoning, after it, as the template would render content
    alone. An assistant turn with several calls becomes one message per call, each followed by its result (by
    tool_call_id, else in order). Copies; the input is unchanged. (The renderer gives the reasoning to templates
    as `thinking` too.)"""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        thought = m.get("reasoning_content")
        if m.get("role") == "assistant" and m.get("tool_calls") and m.get("content") and thought:
            m = {**m, "reasoning_content": f"{thought}\n{m['content']}", "content": ""}
        calls = m.get("tool_calls") or [] if m.get("role") == "assistant" else []
        if len(calls) < 2:
            out.append(m)
            i += 1
            continue
        # several calls in one turn: harmony writes each as its own message, each followed by its result (the
        # template renders one call a turn and names every result after the turn's last call)
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        results = list(messages[i + 1 : j])
        for n, call in enumerate(calls):
            out.append({**m, "tool_calls": [call]} if n == 0 else
                       {"role": "assistant", "content": "", "tool_calls": [call]})
            match = next((r for r in results if call.get("id") and r.get("tool_call_id") == call.get("id")),
                         results[0] if results else None)
            if match is not None:
                results.remove(match)
                out.append(match)
        out.extend(results)
        i = j
    return out
