"""The tool-call formats by name (`--tool-call-parser`; vLLM's names), and detection from a chat template."""

from __future__ import annotations

from tokenmill.entrypoints.openai.harmony import is_harmony_template
from tokenmill.entrypoints.openai.tool_parsers.base import ToolFormat
from tokenmill.entrypoints.openai.tool_parsers.gpt_oss import GptOssToolParser
from tokenmill.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from tokenmill.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from tokenmill.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from tokenmill.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_FORMATS: dict[str, type[ToolFormat]] = {
    cls.name: cls for cls in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, GptOssToolParser,
                              Qwen3CoderToolParser)}
PARSER_CHOICES = ("auto", *TOOL_FORMATS)  # auto: detect_tool_format(the chat template)
DEFAULT_FORMAT = "hermes"  # what a template that shows no format, or renders no tools, gets


def detect_tool_format(template: str | None) -> str:
    """The format a chat template teaches, from the markers its text writes: harmony's channels (gpt-oss:
    `openai`), Mistral's `[TOOL_CALLS]`, Qwen3-Coder / Qwen3.5's `<function=` inside `<tool_call>` (before
    the hermes rule: Qwen2.5 / Qwen3's JSON calls write `<tool_call>` alone), Hermes/Qwen's `<tool_call>`,
    Llama 3's `<|python_tag|>` or header tokens; else hermes."""
    text = template or ""
    if is_harmony_template(text):
        return "openai"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<tool_call>" in text and "<function=" in text:
        return "qwen3_coder"
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and "tools" in text):
        return "llama3_json"
    return DEFAULT_FORMAT


def tool_format(name: str) -> type[ToolFormat]:
    """The format class named `name` (not "auto"); ValueError naming the choices otherwise."""
    if name not in TOOL_FORMATS:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of {', '.join(PARSER_CHOICES)}")
    return TOOL_FORMATS[name]
