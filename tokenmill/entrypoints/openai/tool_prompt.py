"""ToolPrompt: how a model's chat template takes tools, and the fallback for templates that take none.

A template that renders tools (Qwen, Llama 3.1+, Mistral, Hermes: found by rendering a probe tool once) gets
the request's tools as `tools` and the history's calls as `tool_calls` (arguments as objects, as
transformers' templates expect). A template that renders none (SmolLM2's, Gemma 3's) gets the fallback:

- a system prompt, the format's `format_instructions` (hermes unless --tool-call-parser names another):
  the tools as JSON and the call format, put after the conversation's own system message, or first;
- each assistant turn's calls written into its content in that format (`render_calls`);
- tool results as a user turn (consecutive results in one), in that format (`render_tool_result`), since
  such templates often know no `tool` role.

The log says once which of the two this model gets.
"""

from __future__ import annotations

import logging
from typing import Any

from tokenmill.entrypoints.openai.harmony import is_harmony_template
from tokenmill.entrypoints.openai.tool_calling import ToolCalling, arguments_value
from tokenmill.entrypoints.openai.tool_parsers import ToolFormat, detect_tool_format, tool_format
from tokenmill.tokenizer.chat_template import ChatTemplateError
from tokenmill.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("tokenmill.server")

_PROBE_NAME = "tokenmill_probe_function"
_PROBE_TOOL = {"type": "function", "function": {"name": _PROBE_NAME, "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def renders_tools(tokenizer: Tokenizer) -> bool:
    """Whether the chat template writes the tools it is given into the prompt (a probe tool's name shows up).
    A template that rejects the probe conversation counts as rendering them if its text mentions `tools`."""
    template = tokenizer.chat_template
    if not template:
        return False
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                             tools=[_PROBE_TOOL])
    except ChatTemplateError:
        return "tools" in template
    return _PROBE_NAME in text


class ToolPrompt:
    """One model's way with tools: its format (parser, call ids, fallback prompt) and whether its template
    renders tools; turns a request's messages and tools into what the template is given."""

    def __init__(self, tokenizer: Tokenizer, parser_name: str = "auto", announce: bool = True) -> None:
        """`parser_name`: a format name, or "auto" (detected from the template; hermes for a template that
        renders no tools, since the fallback prompt then teaches the format). `announce`: log which case the
        model is in (the chat endpoint does; a second front end over the same model need not repeat it)."""
        self.renders_tools = renders_tools(tokenizer)
        if parser_name == "auto":  # a harmony template's model writes harmony calls, whatever the template shows
            is_shown = self.renders_tools or is_harmony_template(tokenizer.chat_template)
            parser_name = detect_tool_format(tokenizer.chat_template) if is_shown else "hermes"
        self.format: type[ToolFormat] = tool_format(parser_name)
        if announce and self.renders_tools:
            log.info("tool calling: the chat template renders tools; calls are read in the %s format", parser_name)
        elif announce and tokenizer.chat_template:
            log.info("tool calling: the chat template does not render tools, so requests with tools get a "
                     "system prompt that lists them and teaches the %s call format (README: Tool calling)",
                     parser_name)

    def prepare(self, messages: list[dict[str, Any]],
                calling: ToolCalling | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(messages, tools) for the template, from plain messages (messages_for_template's) and the
        request's tool calling. The messages are copied, never changed in place."""
        offered = calling.offered() if calling is not None else None
        if self.renders_tools:
            return [_with_argument_objects(m) for m in messages], offered
        is_parallel = calling.is_parallel if calling is not None else True
        return self.fallback(messages, offered, is_parallel), None

    def fallback(self, messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None,
                 is_parallel: bool) -> list[dict[str, Any]]:
        """The conversation with the tools, calls and results written as text (the module doc's rules)."""
        fmt = self.format()
        names: dict[str, str] = {}  # call id -> function name, for the results
        out: list[dict[str, Any]] = []
        is_merging = False  # the last message out holds tool results, which the next ones join
        for m in messages:
            m = dict(m)
            calls = m.pop("tool_calls", None)
            if m["role"] == "tool":
                # the tool's name: the message's own (Ollama's tool_name), else its call's, found by id
                name = m.get("name") or names.get(m.get("tool_call_id") or "")
                result = fmt.render_tool_result(name, str(m["content"]))
                if is_merging:
                    out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
                else:
                    out.append({"role": "user", "content": result})
                is_merging = True
                continue
            is_merging = False
            if m["role"] == "assistant" and calls:
                for c in calls:
                    names[c.get("id") or ""] = c["function"]["name"]
                written = fmt.render_calls([(c["function"]["name"], arguments_value(c["function"]["arguments"]))
                                            for c in calls])
                m["content"] = f"{m['content']}\n{written}" if m.get("content") else written
            out.append(m)
        if offered:
            system = fmt.format_instructions(offered, is_parallel)
            if out and out[0]["role"] in ("system", "developer"):
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}" if out[0]["content"] else system}
            else:
                out.insert(0, {"role": "system", "content": system})
        return out


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [{**c, "function": {**c["function"],
                                                         "arguments": arguments_value(c["function"]["arguments"])}}
                                      for c in calls]}
