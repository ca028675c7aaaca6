"""POST /v1/messages: Anthropic's Messages API over the chat path (as serving_responses.py does for OpenAI's
Responses API): the request becomes a chat completion request, its answer Anthropic's message or, streamed,
Anthropic's events (message_start, content_block_start / _delta / _stop, message_delta, message_stop).

    system           a string or text blocks: the system message (cache_control marks are accepted; the
                     prefix cache reuses every shared prompt prefix by itself)
    messages         user / assistant turns (a final assistant turn is a prefill: the answer continues it);
                     content a string or blocks: text, tool_use (assistant), tool_result (user: each
                     becomes a tool message before the turn's text; text content only; is_error prefixes
                     it with "Error: "), thinking (assistant: its text goes back to the template as the
                     turn's reasoning)
    max_tokens       required, as Anthropic's; a cut answer has stop_reason max_tokens
    stop_sequences   stop strings; the one that ended the answer is stop_sequence
    tools            {name, description, input_schema}; tool_choice auto / any / tool (name) / none, with
                     disable_parallel_tool_use; calls come back as tool_use blocks (stop_reason tool_use)
    thinking         enabled / adaptive / disabled: the chat template's enable_thinking; with
                     --reasoning-parser the thinking comes back as a thinking block (its signature empty);
                     budget_tokens is not a separate bound here (max_tokens bounds the whole answer)
    output_config    effort: the template's reasoning_effort; format {"type": "json_schema", "schema"}:
                     structured output
    temperature, top_p, top_k (the API's older sampling fields), metadata, service_tier, cache_control (the
    prefix cache reuses shared prefixes by itself), inference_geo, user_profile_id and workspace_id (tags
    that change nothing here), speed "standard"

Errors come in Anthropic's shape ({"type": "error", "error": {"type", "message"}}); image and document
blocks, server tools and MCP servers are 400s naming the field.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from tokenmill.entrypoints.openai.chat_bridge import chat_chunks, renamed
from tokenmill.entrypoints.openai.chat_bridge import chat_request as validated
from tokenmill.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse
from tokenmill.entrypoints.openai.serving_chat import OpenAIServingChat
from tokenmill.entrypoints.server.errors import APIError, bad_request

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 499: "api_error",
                503: "overloaded_error", 504: "api_error"}
_PARAM_NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "tool_choice": "tool_choice",
                "response_format": "output_config.format", "reasoning_effort": "output_config.effort"}


def anthropic_error_body(status: int, message: str, param: str | None) -> dict[str, Any]:
    """Anthropic's error body; the field at fault is named in the message."""
    text = message if param is None or param in message else f"{param}: {message}"
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": text}}


class MessagesRequest(BaseModel):
    """POST /v1/messages (Anthropic's field names; see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    max_tokens: int
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    output_config: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    inference_geo: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    speed: str | None = None
    # refused unless null, so a client hears why
    container: Any = None
    mcp_servers: list[Any] | None = None
    diagnostics: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: the prompt a Messages request would render, counted."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


def _blocks(content: Any, field: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad_request(f"{field} must be a string or a list of content blocks", field)
    return content


def _text(block: dict[str, Any], field: str) -> str:
    if not isinstance(block.get("text"), str):
        raise bad_request(f"{field}: a text block needs text (a string)", field)
    return str(block["text"])


def chat_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages an Anthropic system prompt and turns stand for."""
    out: list[dict[str, Any]] = []
    if system:
        blocks = _blocks(system, "system")
        out.append({"role": "system", "content": "".join(_text(b, "system") for b in blocks)})
    for i, msg in enumerate(messages):
        field = f"messages[{i}]"
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise bad_request(f"{field}.role must be user or assistant, got {role!r}", f"{field}.role")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        thinking: str | None = None
        for j, block in enumerate(_blocks(msg.get("content"), f"{field}.content")):
            bfield, kind = f"{field}.content[{j}]", block.get("type")
            if kind == "text":
                texts.append(_text(block, bfield))
            elif kind == "tool_result" and role == "user":
                result = block.get("content", "")
                parts = [] if isinstance(result, str) else _blocks(result, bfield)
                if any(b.get("type") != "text" for b in parts):
                    raise bad_request(f"{bfield}: only text is supported in a tool_result's content by this server",
                                      bfield)
                text = result if isinstance(result, str) else "".join(_text(b, bfield) for b in parts)
                if not isinstance(block.get("tool_use_id"), str):
                    raise bad_request(f"{bfield}: a tool_result block needs tool_use_id", bfield)
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": ("Error: " + text) if block.get("is_error") else text})
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise bad_request(f"{bfield}: a tool_use block needs id and name", bfield)
                calls.append({"id": block["id"], "type": "function", "function": {
                    "name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "thinking" and role == "assistant":
                thinking = str(block.get("thinking") or "")
            else:
                raise bad_request(f"{bfield}: {kind!r} blocks in {role} turns are not supported by this server "
                                  "(text, tool_use, tool_result, thinking)", bfield)
        if role == "user" and not texts and out and out[-1]["role"] == "tool":
            continue  # a turn of tool results alone
        turn: dict[str, Any] = {"role": role, "content": "".join(texts) if texts or role == "user" else None}
        if calls:
            turn["tool_calls"] = calls
        if thinking is not None:
            turn["reasoning_content"] = thinking
        out.append(turn)
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    return out


def _tools(tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None, body: dict[str, Any]) -> None:
    if tools:
        converted = []
        for i, tool in enumerate(tools):
            if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
                raise bad_request(f"tools[{i}]: only client tools ({{name, description, input_schema}}) are supported "
                                  f"by this server, got type {tool.get('type')!r}", f"tools[{i}]")
            fn = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
            if tool.get("description"):
                fn["description"] = tool["description"]
            converted.append({"type": "function", "function": fn})
        body["tools"] = converted
    if choice is not None:
        kind = choice.get("type")
        mapped = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise bad_request("tool_choice: type tool needs a name", "tool_choice")
            body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif mapped is not None:
            body["tool_choice"] = mapped
        else:
            raise bad_request(f"tool_choice type must be auto, any, tool or none, got {kind!r}", "tool_choice")
        if choice.get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False


def _thinking(thinking: dict[str, Any] | None, body: dict[str, Any]) -> None:
    if thinking is None:
        return
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise bad_request(f"thinking type must be enabled, adaptive or disabled, got {kind!r}", "thinking")
    body["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
    if kind == "disabled":  # no thinking block, whatever the model writes (gpt-oss's analysis, say)
        body["include_reasoning"] = False


def _output_config(config: dict[str, Any] | None, body: dict[str, Any]) -> None:
    if not config:
        return
    unknown = sorted(k for k, v in config.items() if k not in ("effort", "format") and v is not None)
    if unknown:
        raise bad_request(f"output_config.{unknown[0]} is not supported by this server", f"output_config.{unknown[0]}")
    effort = config.get("effort")
    if effort is not None:
        if effort not in ("low", "medium", "high", "xhigh", "max"):
            raise bad_request(f"output_config.effort must be low, medium, high, xhigh or max, got {effort!r}",
                              "output_config.effort")
        # the chat template's reasoning_effort takes OpenAI's levels: the two above high are high
        body["reasoning_effort"] = effort if effort in ("low", "medium", "high") else "high"
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise bad_request("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                              "output_config.format")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    for name, why in (("container", "no server-side tools"), ("mcp_servers", "no server-side tools"),
                      ("diagnostics", "no prompt-cache diagnostics")):
        if getattr(req, name) is not None:
            raise bad_request(f"{name} is not supported by this server ({why})", name)
    if req.speed not in (None, "standard"):
        raise bad_request(f"speed {req.speed!r} is not supported: every request is served alike (standard)", "speed")
    body: dict[str, Any] = {"messages": chat_messages(req.system, req.messages), "max_completion_tokens": req.max_tokens,
                            "stream": bool(req.stream)}
    _prefill(body)
    if req.stream:  # every chunk with its usage: message_start reports the prompt's tokens
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    for ours, theirs in (("stop", req.stop_sequences), ("temperature", req.temperature), ("top_p", req.top_p),
                         ("top_k", req.top_k), ("service_tier", req.service_tier)):
        if theirs is not None:
            body[ours] = theirs
    if req.metadata and isinstance(req.metadata.get("user_id"), str):
        body["user"] = req.metadata["user_id"]
    _tools(req.tools, req.tool_choice, body)
    _thinking(req.thinking, body)
    _output_config(req.output_config, body)
    return validated(body, _PARAM_NAMES)


def _prefill(body: dict[str, Any]) -> None:
    """A final assistant turn is a prefill, as Anthropic takes it: the answer continues that text (and holds only
    what follows it)."""
    last = body["messages"][-1] if body["messages"] else None
    if last is not None and last["role"] == "assistant" and last.get("content") and not last.get("tool_calls"):
        body["continue_final_message"], body["add_generation_prompt"] = True, False


def _stop_reason(finish: str | None, stop_reason: Any, stops: list[str] | None,
                 called: bool = False) -> tuple[str, str | None]:
    """Anthropic's stop_reason (and stop_sequence) for the chat's finish; `called`: the answer holds tool_use
    blocks (Anthropic says tool_use then, a forced tool included, where OpenAI's chat says stop)."""
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls" or (called and finish == "stop"):
        return "tool_use", None
    if isinstance(stop_reason, str) and stop_reason in (stops or []):
        return "stop_sequence", stop_reason
    return "end_turn", None


def _input_of(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class AnthropicMessages:
    """/v1/messages over one model's chat serving."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def count_tokens(self, req: CountTokensRequest) -> dict[str, int]:
        body: dict[str, Any] = {"messages": chat_messages(req.system, req.messages)}
        _prefill(body)
        _tools(req.tools, req.tool_choice, body)
        _thinking(req.thinking, body)
        chat_req = validated(body, _PARAM_NAMES)
        calling = self.chat.tool_calling(chat_req.tools, chat_req.tool_choice, chat_req.parallel_tool_calls)
        prompt = await self.chat.render(chat_req.messages, chat_req.add_generation_prompt,
                                        chat_req.continue_final_message, calling, chat_req.chat_template_kwargs)
        ids = prompt if isinstance(prompt, list) else self.chat.tokenizer.encode(prompt)
        return {"input_tokens": len(ids)}

    async def create(self, req: MessagesRequest, raw_request: Request) -> Any:
        chat_req = chat_request(req)
        try:
            answer = await self.chat.create_chat_completion(chat_req, raw_request)
        except APIError as e:  # the chat field at fault, named as this request names it
            e.param = renamed(e.param, _PARAM_NAMES)
            raise
        message_id = f"msg_{uuid.uuid4().hex}"
        if isinstance(answer, ChatCompletionResponse):
            return self._whole(req, answer, message_id)
        if isinstance(answer, StreamingResponse):
            return StreamingResponse(self._events(req, answer, message_id), media_type="text/event-stream")
        assert isinstance(answer, Response)  # the client went away
        return answer

    def _message(self, message_id: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                 usage: tuple[int, int]) -> dict[str, Any]:
        return {"id": message_id, "type": "message", "role": "assistant", "model": self.chat.served_model_name,
                "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}

    def _whole(self, req: MessagesRequest, answer: ChatCompletionResponse, message_id: str) -> dict[str, Any]:
        choice = answer.choices[0]
        msg = choice.message
        content: list[dict[str, Any]] = []
        if msg.reasoning_content:
            content.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
        if msg.content:
            content.append({"type": "text", "text": msg.content})
        for call in msg.tool_calls or []:
            content.append({"type": "tool_use", "id": call.id, "name": call.function.name,
                            "input": _input_of(call.function.arguments)})
        usage = answer.usage
        assert usage is not None
        return self._message(message_id, content, _stop_reason(choice.finish_reason, choice.stop_reason,
                                                               req.stop_sequences, called=bool(msg.tool_calls)),
                             (usage.prompt_tokens, usage.completion_tokens))

    async def _events(self, req: MessagesRequest, chat_stream: StreamingResponse,
                      message_id: str) -> AsyncIterator[bytes]:
        """Anthropic's events from the chat stream's chunks: one content block at a time (thinking, text, then
        each tool_use with its arguments as input_json_delta pieces)."""
        def event(kind: str, **fields: Any) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()

        index = -1  # the open block's index; -1: none yet
        open_kind: str | None = None
        calls: dict[int, int] = {}  # chat tool call index -> block index
        finish: str | None = None
        stop_reason: Any = None
        usage = (0, 0)
        failed: dict[str, Any] | None = None

        def start(kind: str, block: dict[str, Any]) -> list[bytes]:
            nonlocal index, open_kind
            frames = [event("content_block_stop", index=index)] if open_kind is not None else []
            index += 1
            open_kind = kind
            return [*frames, event("content_block_start", index=index, content_block=block)]

        first = True
        async with contextlib.aclosing(chat_chunks(chat_stream)) as chunks:
            async for chunk in chunks:
                if "error" in chunk:
                    failed = chunk["error"]
                    continue
                if chunk.get("usage"):
                    usage = (chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
                if first:
                    first = False
                    yield event("message_start", message=self._message(message_id, [], (None, None),
                                                                       (usage[0], 0)))
                    yield event("ping")
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    out: list[bytes] = []
                    if delta.get("reasoning_content"):
                        if open_kind != "thinking":
                            out += start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                        out.append(event("content_block_delta", index=index,
                                         delta={"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
                    if delta.get("content"):
                        if open_kind != "text":
                            out += start("text", {"type": "text", "text": ""})
                        out.append(event("content_block_delta", index=index,
                                         delta={"type": "text_delta", "text": delta["content"]}))
                    for call in delta.get("tool_calls") or []:
                        fn = call.get("function") or {}
                        if call["index"] not in calls:
                            out += start("tool_use", {"type": "tool_use", "id": call.get("id") or
                                                      f"toolu_{uuid.uuid4().hex}", "name": fn.get("name") or "",
                                                      "input": {}})
                            calls[call["index"]] = index
                        if calls[call["index"]] == index and fn.get("arguments"):
                            out.append(event("content_block_delta", index=index,
                                             delta={"type": "input_json_delta", "partial_json": fn["arguments"]}))
                    if choice.get("finish_reason"):
                        finish, stop_reason = choice["finish_reason"], choice.get("stop_reason")
                    for frame in out:
                        yield frame
        if failed is not None:
            yield event("error", error={"type": _ERROR_TYPES.get(int(failed.get("code") or 500), "api_error"),
                                        "message": failed.get("message")})
            return
        if first:  # nothing came (cannot happen: the chat stream sends its role chunk first)
            yield event("message_start", message=self._message(message_id, [], (None, None), usage))
        if open_kind is not None:
            yield event("content_block_stop", index=index)
        reason, sequence = _stop_reason(finish, stop_reason, req.stop_sequences, called=bool(calls))
        yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                    usage={"input_tokens": usage[0], "output_tokens": usage[1]})
        yield event("message_stop")
