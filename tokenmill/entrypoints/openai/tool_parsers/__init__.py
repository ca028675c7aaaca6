"""Tool-call parsers: one file per model family's format (hermes, qwen3_coder, llama3_json, mistral, gpt_oss), the forced-call
parsers for constrained output (forced), the streaming wrapper (streaming) and the registry."""

from tokenmill.entrypoints.openai.tool_parsers.base import ParsedOutput, ParsedToolCall, ToolFormat, ToolParser
from tokenmill.entrypoints.openai.tool_parsers.forced import NamedToolParser, RequiredToolParser
from tokenmill.entrypoints.openai.tool_parsers.registry import (PARSER_CHOICES, TOOL_FORMATS, detect_tool_format,
                                                                tool_format)
from tokenmill.entrypoints.openai.tool_parsers.streaming import StreamDelta, ToolCallDelta, ToolCallStream

__all__ = ["NamedToolParser", "PARSER_CHOICES", "ParsedOutput", "ParsedToolCall", "RequiredToolParser",
           "StreamDelta", "TOOL_FORMATS", "ToolCallDelta", "ToolCallStream", "ToolFormat", "ToolParser",
           "detect_tool_format", "tool_format"]
