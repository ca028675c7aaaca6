"""POST /v1/responses: OpenAI's Responses API over the chat path.

A request is translated into a chat completion request (the same template, sampling, tools, structured
output and reasoning parser: serving_chat.py), run there, and its answer translated back: a whole Response
object, or, streamed, Responses' typed events (`response.created`, `response.output_item.added`,
`response.output_text.delta`, ..., `response.completed`) made from the chat stream's chunks.

    input             a string (one user message) or a list of items: messages (role user / system /
                      developer / assistant; content a string or input_text / output_text parts),
                      function_call and function_call_output items (a tool round trip), reasoning items
                      (their text goes back to the template as the next assistant turn's reasoning)
    instructions      a system message before the input
    max_output_tokens max_tokens; an answer cut by it is status "incomplete", reason max_output_tokens
    tools             function tools ({"type": "function", "name", "parameters", ...}); tool_choice as
                      OpenAI's (none / auto / required / {"type": "function", "name"})
    text.format       text, json_object, or json_schema (name, schema, strict): structured output
    reasoning.effort  the chat template's reasoning_effort (reasoning.summary is accepted: no summary is
                      written, a reasoning item's summary is [] and its text is its content)
    stream_options    include_obfuscation accepted: events carry no obfuscation padding here
    temperature, top_p, parallel_tool_calls, metadata, user and vLLM's top_k, min_p, repetition_penalty, seed

Nothing is stored: `store` is answered false (as vLLM does without its store), so previous_response_id,
conversation and GET /v1/responses/{id} are 404s / 400s that say to send the whole conversation in `input`.
Refused with a 400 naming the field: background, other tool types (web search, file search, ...),
truncation "auto" (this server never truncates), image and file inputs, logprobs.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tokenmill.entrypoints.openai.chat_bridge import chat_chunks, renamed
from tokenmill.entrypoints.openai.chat_bridge import chat_request as validated
from tokenmill.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse, ResponsesRequest
from tokenmill.entrypoints.openai.serving_chat import OpenAIServingChat
from tokenmill.entrypoints.server.errors import APIError, bad_request

# chat fields in an error's `param` -> the Responses field the client sent
_PARAM_NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                "response_format": "text.format", "reasoning_effort": "reasoning.effort"}
_WHOLE = frozenset({"messages"})  # chat's message indices are not input's (instructions come first)
# include values accepted: reasoning items carry no encrypted content here (send the reasoning text back instead)
_INCLUDES = {"reasoning.encrypted_content"}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, field: str) -> str:
    """A message's content: a string, or text parts (input_text, output_text, text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{field}.content must be a string or a list of parts", f"{field}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise bad_request(f"{field}.content[{j}]: only text parts (input_text, output_text) are supported by this "
                              f"server, got {kind!r}", f"{field}.content")
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages `instructions` and `input` stand for (OpenAI's item types, in order)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn after it

    def assistant() -> dict[str, Any]:
        """The assistant turn function calls join: the last message if it is one without content after, else new."""
        nonlocal reasoning
        if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
            return messages[-1]
        turn: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
        if reasoning is not None:
            turn["reasoning_content"], reasoning = reasoning, None
        messages.append(turn)
        return turn

    for i, item in enumerate(req.input):
        field = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{field}.role must be user, system, developer or assistant, got {role!r}",
                                  f"{field}.role")
            msg: dict[str, Any] = {"role": role, "content": _text_of(item.get("content"), field)}
            if role == "assistant" and reasoning is not None:
                msg["reasoning_content"], reasoning = reasoning, None
            messages.append(msg)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad_request(f"{field}: a function_call item needs {key} (a string)", f"{field}.{key}")
            assistant()["tool_calls"].append({"id": item["call_id"], "type": "function",
                                              "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{field}: a function_call_output item needs call_id", f"{field}.call_id")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _text_of(output, field)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                      for p in parts):
                raise bad_request(f"{field}: a reasoning item's content is a list of parts with text", f"{field}.content")
            reasoning = "".join(p["text"] for p in parts)
        elif kind == "item_reference":
            raise bad_request(f"{field}: item references need stored responses, and this server stores none: send "
                              "the items themselves", f"{field}.type")
        else:
            raise bad_request(f"{field}: input items of type {kind!r} are not supported by this server (message, "
                              "function_call, function_call_output, reasoning)", f"{field}.type")
    if not messages:
        raise bad_request("input must not be empty", "input")
    return messages


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request `req` stands for; a 400 naming the Responses field for what cannot be."""
    for name, why in (("previous_response_id", "this server stores no responses: send the whole conversation in "
                                                "input"),
                      ("conversation", "this server stores no conversations: send the whole conversation in input"),
                      ("top_logprobs", "logprobs are not available on /v1/responses here (use /v1/chat/completions)"),
                      ("max_tool_calls", "the number of calls is not limited here (parallel_tool_calls false: one)"),
                      ("prompt", "stored prompt templates are not available here")):
        if getattr(req, name) is not None:
            raise bad_request(f"{name} is not supported: {why}", name)
    if req.background:
        raise bad_request("background is not supported: answers are streamed or returned at once", "background")
    if req.truncation == "auto":
        raise bad_request("truncation 'auto' is not supported: this server never truncates a conversation (a "
                          "prompt that does not fit is a 400); use 'disabled'", "truncation")
    for value in req.include or []:
        if value not in _INCLUDES:
            raise bad_request(f"include {value!r} is not supported (accepted: {', '.join(sorted(_INCLUDES))})",
                              "include")
    for name, fields, known in (("text", req.text, {"format"}), ("reasoning", req.reasoning, {"effort", "summary"}),
                                ("stream_options", req.stream_options, {"include_obfuscation"})):
        unknown = sorted(k for k, v in (fields or {}).items() if k not in known and v is not None)
        if unknown:
            raise bad_request(f"{name}.{unknown[0]} is not supported by this server (it reads {name}."
                              f"{', '.join(sorted(known))})", f"{name}.{unknown[0]}")
    body: dict[str, Any] = {"messages": chat_messages(req), "stream": bool(req.stream)}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    for ours, theirs in (("max_completion_tokens", req.max_output_tokens), ("temperature", req.temperature),
                         ("top_p", req.top_p), ("parallel_tool_calls", req.parallel_tool_calls),
                         ("metadata", req.metadata), ("user", req.user), ("safety_identifier", req.safety_identifier),
                         ("prompt_cache_key", req.prompt_cache_key), ("service_tier", req.service_tier),
                         ("top_k", req.top_k), ("min_p", req.min_p), ("repetition_penalty", req.repetition_penalty),
                         ("seed", req.seed)):
        if theirs is not None:
            body[ours] = theirs
    if req.tools:
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.get("type") != "function":
                raise bad_request(f"tools[{i}]: tools of type {tool.get('type')!r} are not supported by this server "
                                  "(function tools only)", f"tools[{i}].type")
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
            tools.append({"type": "function", "function": fn})
        body["tools"] = tools
    if isinstance(req.tool_choice, dict):
        if req.tool_choice.get("type") != "function" or not isinstance(req.tool_choice.get("name"), str):
            raise bad_request("tool_choice: a named choice is {\"type\": \"function\", \"name\": ...}", "tool_choice")
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice["name"]}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = (req.text or {}).get("format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema":
            schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif kind in ("json_object", "text"):
            body["response_format"] = {"type": kind}
        else:
            raise bad_request(f"text.format type must be text, json_object or json_schema, got {kind!r}", "text.format")
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        body["reasoning_effort"] = effort
    return validated(body, _PARAM_NAMES, _WHOLE)


class OpenAIServingResponses:
    """/v1/responses over one model's chat serving."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    def _skeleton(self, req: ResponsesRequest, response_id: str, created: int) -> dict[str, Any]:
        """The Response object's fields that echo the request (OpenAI's shape), status in progress."""
        tools = [{**t, "strict": t.get("strict")} for t in req.tools or []]
        defaults = self.chat.engine.sampling_defaults  # what ran where the request left a field out
        return {"id": response_id, "object": "response", "created_at": created, "status": "in_progress",
                "model": self.chat.served_model_name, "output": [], "error": None, "incomplete_details": None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": None,
                "reasoning": req.reasoning or {"effort": None, "summary": None}, "store": False,
                "temperature": defaults.pick("temperature", req.temperature, 1.0),
                "top_p": defaults.pick("top_p", req.top_p, 1.0), "text": req.text or {"format": {"type": "text"}},
                "tool_choice": req.tool_choice or "auto", "tools": tools, "truncation": "disabled",
                "metadata": req.metadata or {}, "user": req.user, "usage": None}

    def _usage(self, prompt: int, completion: int, cached: int, reasoning_text: str) -> dict[str, Any]:
        """Responses' usage: the reasoning's tokens are its text encoded again (the parser splits text, not ids)."""
        reasoning = len(self.chat.tokenizer.encode(reasoning_text)) if reasoning_text else 0
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": min(reasoning, completion)},
                "total_tokens": prompt + completion}

    async def create(self, req: ResponsesRequest, raw_request: Request) -> Any:
        try:
            chat_req = chat_request(req)
            answer = await self.chat.create_chat_completion(chat_req, raw_request)
        except APIError as e:  # the chat field at fault, named as this request names it
            e.param = renamed(e.param, _PARAM_NAMES, _WHOLE)
            raise
        response_id, created = _new_id("resp"), int(time.time())
        if isinstance(answer, ChatCompletionResponse):
            return self._whole(req, answer, response_id, created)
        if isinstance(answer, StreamingResponse):
            return StreamingResponse(self._events(req, answer, response_id, created), media_type="text/event-stream")
        assert isinstance(answer, Response)  # the client went away (499)
        return answer

    def _whole(self, req: ResponsesRequest, answer: ChatCompletionResponse, response_id: str,
               created: int) -> dict[str, Any]:
        choice = answer.choices[0]
        msg = choice.message
        output: list[dict[str, Any]] = []
        thought = msg.reasoning_content or ""
        if thought:
            output.append({"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "completed",
                           "content": [{"type": "reasoning_text", "text": thought}]})
        if msg.content:
            output.append({"type": "message", "id": _new_id("msg"), "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": msg.content, "annotations": []}]})
        for call in msg.tool_calls or []:
            output.append({"type": "function_call", "id": _new_id("fc"), "call_id": call.id,
                           "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
        body = self._skeleton(req, response_id, created)
        cut = choice.finish_reason == "length"
        if cut and output:  # the item the limit cut is incomplete, as the response is
            output[-1]["status"] = "incomplete"
        usage = answer.usage
        assert usage is not None  # a whole answer always counts its tokens
        body |= {"status": "incomplete" if cut else "completed", "output": output,
                 "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                 "usage": self._usage(usage.prompt_tokens, usage.completion_tokens,
                                      usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0,
                                      thought)}
        return body

    async def _events(self, req: ResponsesRequest, chat_stream: StreamingResponse, response_id: str,
                      created: int) -> AsyncIterator[bytes]:
        """Responses' typed events from the chat stream's chunks: one output item at a time (reasoning, then the
        message, then function calls), each opened, filled by deltas and closed with its whole text."""
        body = self._skeleton(req, response_id, created)
        seq = 0
        open_item: dict[str, Any] | None = None  # the item being streamed
        calls: dict[int, dict[str, Any]] = {}  # tool call index -> its item
        finish: str | None = None
        usage = (0, 0, 0)  # prompt, completion, cached

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            data = {"type": kind, "sequence_number": seq, **fields}
            seq += 1
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

        def close(cut: bool = False) -> list[bytes]:
            """The open item's closing events; it joins the output (`cut`: the token limit ended it)."""
            nonlocal open_item
            item, open_item = open_item, None
            if item is None:
                return []
            index = len(body["output"])
            item["status"] = "incomplete" if cut else "completed"
            body["output"].append(item)
            frames = []
            if item["type"] == "message":
                part = item["content"][0]
                frames += [event("response.output_text.done", item_id=item["id"], output_index=index,
                                 content_index=0, text=part["text"], logprobs=[]),
                           event("response.content_part.done", item_id=item["id"], output_index=index,
                                 content_index=0, part=part)]
            elif item["type"] == "reasoning":
                frames.append(event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                    content_index=0, text=item["content"][0]["text"]))
            else:
                frames.append(event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                    name=item["name"], arguments=item["arguments"]))
            return [*frames, event("response.output_item.done", output_index=index, item=item)]

        def start(item: dict[str, Any]) -> list[bytes]:
            nonlocal open_item
            frames = close()
            open_item = item
            shown = {**item, "content": []} if "content" in item else dict(item)
            frames.append(event("response.output_item.added", output_index=len(body["output"]), item=shown))
            if item["type"] == "message":
                frames.append(event("response.content_part.added", item_id=item["id"], output_index=len(body["output"]),
                                    content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
            return frames

        yield event("response.created", response=body)
        yield event("response.in_progress", response=body)
        failed: dict[str, Any] | None = None
        async with contextlib.aclosing(chat_chunks(chat_stream)) as chunks:
            async for chunk in chunks:
                if "error" in chunk:
                    failed = chunk["error"]
                    continue
                if chunk.get("usage") and not chunk.get("choices"):
                    u = chunk["usage"]
                    usage = (u["prompt_tokens"], u["completion_tokens"],
                             (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    out: list[bytes] = []
                    thought = delta.get("reasoning_content")
                    if thought:
                        if open_item is None or open_item["type"] != "reasoning":
                            out += start({"type": "reasoning", "id": _new_id("rs"), "summary": [],
                                          "status": "in_progress",
                                          "content": [{"type": "reasoning_text", "text": ""}]})
                        assert open_item is not None
                        open_item["content"][0]["text"] += thought
                        out.append(event("response.reasoning_text.delta", item_id=open_item["id"],
                                         output_index=len(body["output"]), content_index=0, delta=thought))
                    content = delta.get("content")
                    if content:
                        if open_item is None or open_item["type"] != "message":
                            out += start({"type": "message", "id": _new_id("msg"), "status": "in_progress",
                                          "role": "assistant",
                                          "content": [{"type": "output_text", "text": "", "annotations": []}]})
                        assert open_item is not None
                        open_item["content"][0]["text"] += content
                        out.append(event("response.output_text.delta", item_id=open_item["id"],
                                         output_index=len(body["output"]), content_index=0, delta=content,
                                         logprobs=[]))
                    for call in delta.get("tool_calls") or []:
                        fn = call.get("function") or {}
                        if call["index"] not in calls:
                            calls[call["index"]] = {"type": "function_call", "id": _new_id("fc"),
                                                    "call_id": call.get("id") or _new_id("call"),
                                                    "name": fn.get("name") or "", "arguments": "",
                                                    "status": "in_progress"}
                            out += start(calls[call["index"]])
                        item = calls[call["index"]]
                        if item is not open_item:  # a call's pieces come together; a late one reopens nothing
                            continue
                        piece = fn.get("arguments") or ""
                        if piece:
                            item["arguments"] += piece
                            out.append(event("response.function_call_arguments.delta", item_id=item["id"],
                                             output_index=len(body["output"]), delta=piece))
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                    for frame in out:
                        yield frame
        for frame in close(cut=finish == "length"):
            yield frame
        thought_text = "".join(i["content"][0]["text"] for i in body["output"] if i["type"] == "reasoning")
        body["usage"] = self._usage(usage[0], usage[1], usage[2], thought_text)
        if failed is not None:
            body |= {"status": "failed", "error": {"code": str(failed.get("code")), "message": failed.get("message")}}
            yield event("error", code=str(failed.get("code")), message=failed.get("message"), param=failed.get("param"))
            yield event("response.failed", response=body)
        elif finish == "length":
            body |= {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
            yield event("response.incomplete", response=body)
        else:
            body["status"] = "completed"
            yield event("response.completed", response=body)
