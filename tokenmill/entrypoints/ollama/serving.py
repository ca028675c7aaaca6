"""OllamaServing: POST /api/generate and /api/chat, streamed as NDJSON or answered whole.

It is an OpenAIServing (openai/serving_engine.py) for everything that is not the wire format: admission,
the input path, running a request with abort on client disconnect and the request timeout, the engine's
errors as APIErrors, logprob token text. Only the prompt building and the answer's shape are Ollama's.

    generate prompt:  raw            the prompt as it is
                      template       the request's Go template (go_template.py) over System, Prompt, Suffix
                      suffix         the model's fill-in-middle tokens: PRE prompt SUF suffix MID
                      otherwise      the model's chat template over [system], user prompt
                      then `context` (a previous answer's token ids) goes in front, without a second BOS
    chat prompt:      the model's chat template over the messages; a final assistant message is continued;
                      `tools` as the OpenAI chat endpoint renders them (ToolPrompt: the template's own way,
                      or the fallback system prompt), the history's calls and tool results with them
    chat tools:       the answer is read by the --tool-call-parser format (Ollama has no tool_choice: "auto");
                      its calls go in `message.tool_calls` with arguments as objects, the rest is the content.
                      A stream sends the content as it comes (a call's text never), the calls in the done object

A harmony model (gpt-oss: openai/harmony.py) has its answers read as harmony, whatever `think` says (it
always reasons): the analysis channel is `thinking` (left out when `think` is false), the final channel the
content (generate's `response`, when the model's chat template made the prompt), calls to functions.NAME
the chat's tool calls.

A stream is one JSON object per line (`application/x-ndjson`): `done: false` objects with the new text,
then one `done: true` object with done_reason, the token counts and the durations in nanoseconds (and
generate's `context`: the prompt's and the answer's token ids). A failure once the stream has started is a
last line `{"error": "..."}`, which Ollama's clients raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tokenmill.engine.input_processor import ProcessedPrompt
from tokenmill.entrypoints.ollama import go_template
from tokenmill.entrypoints.ollama.model_card import ModelCard, timestamp
from tokenmill.entrypoints.ollama.options import OptionsMapper, RequestOptions
from tokenmill.entrypoints.ollama.protocol import (AssistantMessage, ChatRequest, ChatResponse, GenerateRequest,
                                                   GenerateResponse, GenerationFields, Message, TokenLogprob,
                                                   ToolCallAnswer, ToolCallFunctionAnswer, TopLogprob)
from tokenmill.entrypoints.openai.harmony import Harmony, HarmonyCall, HarmonyReader, harmony_history, harmony_tools
from tokenmill.entrypoints.openai.protocol import ChatCompletionTool
from tokenmill.entrypoints.openai.reasoning import ReasoningStream, starts_inside
from tokenmill.entrypoints.openai.reasoning import split as split_reasoning
from tokenmill.entrypoints.openai.serving_engine import OpenAIServing
from tokenmill.entrypoints.openai.tool_calling import ToolCalling
from tokenmill.entrypoints.openai.tool_parsers import ToolCallStream
from tokenmill.entrypoints.openai.tool_prompt import ToolPrompt
from tokenmill.entrypoints.server.app import ServerContext
from tokenmill.entrypoints.server.errors import APIError, bad_request
from tokenmill.entrypoints.server.loaded_model import LoadedModel
from tokenmill.outputs import RequestOutput, TokenLogprobs
from tokenmill.sampling_params import MAX_LOGPROBS, ParamError, StructuredOutputsParams
from tokenmill.tokenizer.chat_template import ChatTemplateSecurityError

log = logging.getLogger("tokenmill.server")
NDJSON = "application/x-ndjson"


class OllamaServing(OpenAIServing):
    def __init__(self, ctx: ServerContext, model: LoadedModel) -> None:
        """Ollama's endpoints over one loaded model of `ctx.pool`."""
        super().__init__(model.async_engine, model.name, ctx.metrics.model(model.name), ctx.state,
                         ctx.config.max_waiting_requests, request_timeout=ctx.config.request_timeout,
                         log_prompts=ctx.config.log_prompts, accepts=ctx.pool.accepts(model.name),
                         served_names=ctx.pool.names)
        self.card = ModelCard.of(self.engine, model.name)
        self.options = OptionsMapper(self.max_model_len, self.vocab_size, self.engine.sampling_defaults)
        self.tool_prompt = ToolPrompt(self.tokenizer, ctx.config.tool_call_parser, announce=False)
        self.reasoning_parser = ctx.config.reasoning_parser
        self.harmony = Harmony.of(self.tokenizer, ctx.config.reasoning_parser, ctx.config.tool_call_parser,
                                  announce=False)  # the chat endpoint's says it

    @property
    def reads_thinking(self) -> bool:
        """Whether answers come with their thinking apart (a reasoning parser, or a harmony model)."""
        return self.reasoning_parser is not None or self.harmony is not None

    # -- checks ----------------------------------------------------------------------------------------
    def check_ollama_model(self, name: str | None) -> None:
        """Ollama's 400 without a model, its 404 for a model this server does not serve."""
        if not name:
            raise bad_request("model is required", "model")
        if not self.accepts(name):
            raise ollama_not_found(name)

    def _request_options(self, req: GenerationFields) -> RequestOptions:
        """The checks generate and chat share, then the options as SamplingParams."""
        self.check_ollama_model(req.model)
        if req.think not in (None, False) and not self.reads_thinking:
            raise bad_request(f'"{req.model}" does not support thinking (Ollama\'s words): this server splits the '
                              "thinking out only when started with --reasoning-parser (qwen3 or deepseek_r1)", "think")
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
                              "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return self.options.map(req.options, logprobs=logprobs, structured_outputs=_structured(req.format))

    # -- prompts ---------------------------------------------------------------------------------------
    async def _generate_ids(self, req: GenerateRequest) -> list[int]:
        """The token ids of a generate request's prompt (see the module docstring)."""
        prompt, suffix, system = req.prompt or "", req.suffix or "", req.system
        special = not req.context  # a continued context already starts with the BOS it needs
        if req.raw:
            for name in ("template", "system", "suffix"):
                if getattr(req, name):
                    raise bad_request(f"{name} is not used with raw: true (the prompt goes to the model as it is)",
                                      name)
            ids = await self.encode(prompt, special)
        elif req.template:  # an empty template: the model's, as Ollama takes it
            if suffix and not go_template.uses_field(req.template, "Suffix"):
                raise bad_request("suffix: the template does not use {{ .Suffix }}", "suffix")
            messages = [*([{"Role": "system", "Content": system}] if system else []),
                        {"Role": "user", "Content": prompt}]
            values = {"System": system or "", "Prompt": prompt, "Suffix": suffix, "Response": "",
                      "Messages": messages, "Tools": None, "Think": False, "ThinkLevel": "", "IsThinkSet": False}
            try:
                text = await asyncio.to_thread(go_template.render, req.template, values)
            except go_template.TemplateError as e:
                raise bad_request(f"template: {e}", "template") from None
            ids = await self.encode(text, special)
        elif suffix:
            ids = await self._fill_in_middle(prompt, suffix, system, special)
        else:
            messages = [*([{"role": "system", "content": system}] if system else []),
                        {"role": "user", "content": prompt}]
            ids = await self.encode(await self._render(messages, "prompt", think=req.think), special)
        return [*req.context, *ids] if req.context else ids

    async def _fill_in_middle(self, prompt: str, suffix: str, system: str | None, special: bool) -> list[int]:
        if self.card.fim_token_ids is None:
            raise bad_request(f"suffix: the model {self.card.name} cannot fill in the middle (its vocabulary has no "
                              "fill-in-middle tokens); send the whole prompt, or a template that uses "
                              "{{ .Suffix }}", "suffix")
        if system:
            raise bad_request("system is not used with suffix (a fill-in-middle prompt has no system part)", "system")
        pre, suf, mid = self.card.fim_token_ids
        bos = await self.encode("", special)
        return [*bos, pre, *await self.encode(prompt, False), suf, *await self.encode(suffix, False), mid]

    async def _render(self, messages: list[dict[str, Any]], field: str, is_continued: bool = False,
                      tools: list[dict[str, Any]] | None = None, think: Any = None) -> str:
        """The model's chat template over `messages` (and `tools`), on a worker thread. A template that
        rejects the conversation is a 400; one the sandbox refused is the model's fault: a 500 that says so.
        `think` true / false renders with enable_thinking true / false, as Ollama does for a template that can
        think (Qwen3's); a level (high, medium, low: gpt-oss's) thinks, with the level as the template's
        reasoning_effort; other templates do not read them."""
        kwargs: dict[str, Any] | None = {"enable_thinking": think} if isinstance(think, bool) else None
        if isinstance(think, str):
            kwargs = {"enable_thinking": True, "reasoning_effort": think}
        try:
            return await asyncio.to_thread(self.input_processor.render_chat, messages, not is_continued, tools, field,
                                           continue_final_message=is_continued, template_kwargs=kwargs)
        except ChatTemplateSecurityError as e:
            raise APIError(500, f"the model's chat template was refused and nothing it attempted ran ({e}); chat "
                                "cannot be served with this template, raw generate still works") from None
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    def _fit(self, ids: list[int], ro: RequestOptions, field: str) -> ProcessedPrompt:
        """The input path's checks, then the output's room: num_predict, and what num_ctx leaves."""
        prompt = self.process_prompt(ids, ro.params, field)
        room = ro.num_ctx - len(prompt.prompt_token_ids)
        if room < 1:
            raise bad_request(f"the prompt is {len(prompt.prompt_token_ids)} tokens, which leaves no room for output "
                              f"in num_ctx {ro.num_ctx}; shorten the prompt or raise num_ctx (at most "
                              f"{self.max_model_len}): this server never truncates a prompt", field)
        return dataclasses.replace(prompt, max_tokens=min(prompt.max_tokens, room, ro.num_predict or room))

    # -- the endpoints ---------------------------------------------------------------------------------
    async def create_generate(self, req: GenerateRequest, raw_request: Request, load_seconds: float = 0.0,
                              is_unloading: bool = False) -> Response:
        """`load_seconds`: how long the request waited for its model to load; `is_unloading`: its keep-alive
        is 0 (an empty request then answers done_reason "unload", Ollama's way to stop a model)."""
        received = time.monotonic() - load_seconds
        ro = self._request_options(req)
        if req.images:
            raise bad_request(f"images: {self.card.name} takes text only", "images")
        for name in ("width", "height", "steps"):
            if getattr(req, name) is not None:
                raise bad_request(f"{name}: this server does not generate images", name)
        if not req.prompt and not req.suffix:  # Ollama's way to load (or unload) a model: nothing to generate
            return self._loaded(GenerateResponse(model=req.model, created_at=timestamp(), response="", done=True,
                                                 done_reason="unload" if is_unloading else "load"))
        prompt = self._fit(await self._generate_ids(req), ro, "prompt")
        # the model's own template made the prompt: its answer is read as that template's (harmony) format
        is_templated = not (req.raw or req.template or req.suffix)
        harmony = self._harmony_reader(ro, None) if is_templated else None
        return await self._answer(req, prompt, ro, raw_request, received, load_seconds, is_chat=False,
                                  harmony=harmony)

    async def create_chat(self, req: ChatRequest, raw_request: Request, load_seconds: float = 0.0,
                          is_unloading: bool = False) -> Response:
        """As create_generate."""
        received = time.monotonic() - load_seconds
        ro = self._request_options(req)
        calling = self._tool_calling(req.tools)
        if not req.messages:
            return self._loaded(ChatResponse(model=req.model, created_at=timestamp(), message=AssistantMessage(content=""),
                                             done=True, done_reason="unload" if is_unloading else "load"))
        is_continued = req.messages[-1].role == "assistant"  # Ollama continues a final assistant message
        if calling is not None and not calling.format.skip_special_tokens:
            ro.params.skip_special_tokens = False  # the format's markers are special tokens
        harmony = self._harmony_reader(ro, calling)
        messages, tools = self.tool_prompt.prepare(_plain_messages(req.messages), calling)
        if harmony is not None:
            messages, tools = harmony_history(messages), harmony_tools(tools)
        text = await self._render(messages, "messages", is_continued, tools, think=req.think)
        prompt = self._fit(await self.encode(text), ro, "messages")
        return await self._answer(req, prompt, ro, raw_request, received, load_seconds, is_chat=True, calling=calling,
                                  harmony=harmony)

    def _harmony_reader(self, ro: RequestOptions, calling: ToolCalling | None) -> HarmonyReader | None:
        """A harmony model's reading of this answer (None for other models); its text then keeps the markers,
        and the vocabulary's other special tokens are dropped from what is shown (Ollama's clients never see
        special tokens)."""
        if self.harmony is None:
            return None
        ro.params.skip_special_tokens = False
        return self.harmony.reader(calling.accepts if calling is not None else None, None, skip_special_tokens=True)

    def _tool_calling(self, tools: list[dict[str, Any]] | None) -> ToolCalling | None:
        """The request's tools, checked as the chat endpoint checks them (Ollama's tool objects are OpenAI's,
        `type` optional); None without tools. A bad tool is a 400 naming it."""
        if not tools:
            return None
        checked = []
        for i, tool in enumerate(tools):
            try:
                checked.append(ChatCompletionTool.model_validate({**tool, "type": tool.get("type") or "function"}))
            except pydantic.ValidationError as e:
                err = e.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                raise bad_request(f"tools[{i}].{where}: {err['msg']}", f"tools[{i}]") from None
        try:
            return ToolCalling.of(checked, None, None, self.tool_prompt.format)
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    @staticmethod
    def _loaded(answer: GenerateResponse | ChatResponse) -> Response:
        return JSONResponse(answer.model_dump(exclude_none=True))

    async def _answer(self, req: GenerateRequest | ChatRequest, prompt: ProcessedPrompt, ro: RequestOptions,
                      raw_request: Request, received: float, load_seconds: float, is_chat: bool,
                      calling: ToolCalling | None = None, harmony: HarmonyReader | None = None) -> Response:
        await self.compile_structured(ro.params)  # `format`: a schema that does not compile is a 400
        self.check_admission()
        request_id = self.new_id("ollama")
        self.maybe_log_prompt(request_id, [m.model_dump(exclude_none=True) for m in req.messages or []]
                              if isinstance(req, ChatRequest) else req.prompt)
        reasoning = None  # think: true (or a level) splits the thinking out (reasoning.py)
        if req.think not in (None, False) and harmony is None:
            reasoning = starts_inside(self.tokenizer, prompt.prompt_token_ids, ro.params.structured_outputs is not None)
        answer = _Answer(req.model, is_chat, prompt, received, load_seconds, calling, reasoning, harmony,
                         shows_thinking=req.think is not False)
        if req.stream is not False:
            return StreamingResponse(self._stream(request_id, prompt, ro, answer), media_type=NDJSON)
        whole = await self.until_disconnect(self._collect(request_id, prompt, ro, answer), raw_request)
        return JSONResponse(whole) if whole is not None else Response(status_code=499)

    async def _collect(self, request_id: str, prompt: ProcessedPrompt, ro: RequestOptions,
                       answer: _Answer) -> dict[str, Any]:
        final: RequestOutput | None = None
        async with contextlib.aclosing(self.generate(request_id, prompt, ro.params)) as outputs:
            async for out in outputs:
                if out.finished:
                    self.check_finished(out)
                    final = out
        assert final is not None  # generate ends only after the finished output
        c = final.outputs[0]
        lps = self._logprobs(c.token_ids, c.logprobs) if c.logprobs is not None else None
        return answer.final(final, c.text, lps)

    async def _stream(self, request_id: str, prompt: ProcessedPrompt, ro: RequestOptions,
                      answer: _Answer) -> AsyncIterator[bytes]:
        num_sent = 0  # generated tokens whose logprobs went out
        try:
            async with contextlib.aclosing(self.generate(request_id, prompt, ro.params)) as outputs:
                async for out in outputs:
                    if out.finished:
                        self.check_finished(out)
                    c = out.outputs[0]
                    lps = None
                    if c.logprobs is not None and c.delta_token_ids:
                        lps = self._logprobs(c.delta_token_ids, c.logprobs[num_sent:num_sent + len(c.delta_token_ids)])
                    num_sent += len(c.delta_token_ids)
                    cut = c.finish_reason is not None and c.finish_reason.value == "length"
                    thought, text = answer.streamed_text(c.delta_text, is_final=out.finished, cut=cut)
                    if text or thought or lps:
                        yield answer.piece(text, lps, thought)
                    if out.finished:
                        yield _line(answer.final(out, "", None))
        except APIError as e:  # headers are sent: the error goes in the stream, as Ollama's does
            yield _line({"error": e.message})

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs]) -> list[TokenLogprob]:
        """Ollama's logprobs: per token its text, logprob and bytes, with the top alternatives."""
        out = []
        for tok, lp in zip(token_ids, logprobs):
            text = self.token_text(tok)
            top = [TopLogprob(token=self.token_text(a.token_id), logprob=self.clamp_logprob(a.logprob),
                              bytes=self.token_bytes(a.token_id)) for a in lp.top]
            out.append(TokenLogprob(token=text, logprob=self.clamp_logprob(lp.logprob), bytes=self.token_bytes(tok),
                                    top_logprobs=top))
        return out


class _Answer:
    """One request's answer objects: generate's (`response`, `context`) or chat's (`message`, with the tool
    calls read from the text when the request has tools)."""

    def __init__(self, model: str, is_chat: bool, prompt: ProcessedPrompt, received: float, load_seconds: float,
                 calling: ToolCalling | None = None, reasoning: bool | None = None,
                 harmony: HarmonyReader | None = None, shows_thinking: bool = True) -> None:
        self.model = model
        self.is_chat = is_chat
        self.prompt = prompt
        self.received = received  # monotonic time the route got the request (before its model loaded)
        self.load_seconds = load_seconds
        self.calling = calling
        # a stream with tools: the text goes through the parser, which holds back what may become a call
        self.tool_stream = (ToolCallStream(calling.parser(), calling.format.new_call_id)
                            if calling and harmony is None else None)
        # think: true: the reasoning split from the text first (`reasoning`: the answer starts inside it)
        self.reasoning = reasoning
        self.thinking = ReasoningStream(reasoning) if reasoning is not None else None
        # a harmony model: thinking, content and calls in one reading (the calls kept for the done object)
        self.harmony = harmony.stream() if harmony is not None else None
        self.harmony_calls: list[HarmonyCall] = []
        self.shows_thinking = shows_thinking  # harmony's thinking is shown unless think is false

    def streamed_text(self, delta_text: str, is_final: bool, cut: bool = False) -> tuple[str, str]:
        """(thinking, content) a stream sends for `delta_text` (all of it content without tools or think);
        `cut`: the answer ended at its length limit (a harmony call still open is then no call)."""
        if self.harmony is not None:
            news = self.harmony.feed(delta_text, is_final, cut)
            self.harmony_calls += news.tool_calls
            return (news.reasoning if self.shows_thinking else ""), news.content
        thought = ""
        if self.thinking is not None:
            thought, delta_text = self.thinking.feed(delta_text, is_final)
        if self.tool_stream is None:
            return thought, delta_text
        return thought, self.tool_stream.feed(delta_text, is_final).content

    def _object(self, text: str, tool_calls: list[ToolCallAnswer] | None = None, thinking: str | None = None,
                **fields: Any) -> GenerateResponse | ChatResponse:
        if self.is_chat:
            return ChatResponse(model=self.model, created_at=timestamp(),
                                message=AssistantMessage(content=text, thinking=thinking, tool_calls=tool_calls),
                                **fields)
        return GenerateResponse(model=self.model, created_at=timestamp(), response=text, thinking=thinking, **fields)

    def _content_and_calls(self, text: str) -> tuple[str, list[ToolCallAnswer] | None]:
        """The done object's content and calls. `text` is the whole answer, or "" at the end of a stream,
        whose content went out in pieces: its calls are then read from the text it streamed."""
        if self.calling is None or self.tool_stream is None:
            return text, None
        streamed = self.tool_stream.text
        parsed = self.calling.parse(streamed or text)
        calls = [ToolCallAnswer(function=ToolCallFunctionAnswer(index=i, name=c.name, arguments=json.loads(c.arguments)))
                 for i, c in enumerate(parsed.tool_calls)]  # a parser's arguments are a JSON object's text
        return ("" if streamed else parsed.content), calls or None

    def piece(self, text: str, logprobs: list[TokenLogprob] | None, thinking: str = "") -> bytes:
        return _line(self._object(text, thinking=thinking or None, done=False,
                                  logprobs=logprobs).model_dump(exclude_none=True))

    def final(self, out: RequestOutput, text: str, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
        """The done object: why it ended, the counts, the durations (ns) and, for generate, the context."""
        c, m = out.outputs[0], out.metrics
        now = time.monotonic()
        finished = m.finished_time if m and m.finished_time else now
        scheduled = m.first_scheduled_time if m and m.first_scheduled_time else finished
        first_token = m.first_token_time if m and m.first_token_time else finished
        context = None if self.is_chat else [*self.prompt.prompt_token_ids, *c.token_ids]
        thought = None
        if self.reasoning is not None and text:  # the whole answer (a stream's went out in pieces)
            thought, text = split_reasoning(text, self.reasoning)
        if self.harmony is not None:
            cut = c.finish_reason is not None and c.finish_reason.value == "length"
            thought, content = self.streamed_text(text, is_final=True, cut=cut) if text else ("", "")
            calls = [ToolCallAnswer(function=ToolCallFunctionAnswer(index=i, name=c.name,
                                                                    arguments=json.loads(c.arguments)))
                     for i, c in enumerate(self.harmony_calls)] or None
            thought = thought or None
        else:
            content, calls = self._content_and_calls(text)
        obj = self._object(content, calls, thought, done=True, done_reason=c.finish_reason.value if c.finish_reason else "stop",
                           total_duration=_ns(finished - self.received), load_duration=_ns(self.load_seconds),
                           prompt_eval_count=len(self.prompt.prompt_token_ids),
                           prompt_eval_duration=_ns(first_token - scheduled), eval_count=len(c.token_ids),
                           eval_duration=_ns(finished - first_token), logprobs=logprobs,
                           **({} if context is None else {"context": context}))
        return obj.model_dump(exclude_none=True)


def ollama_not_found(name: str) -> APIError:
    """Ollama's 404 for a model this server does not serve."""
    return APIError(404, f"model '{name}' not found", "model")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _structured(fmt: str | dict[str, Any] | None) -> StructuredOutputsParams | None:
    """`format`: "json" is any JSON object, a dict is a JSON schema the output must follow."""
    if not fmt:
        return None
    if fmt == "json":
        return StructuredOutputsParams(json_object=True, source="format")
    return StructuredOutputsParams(json=fmt, source="format")


def _plain_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template; tool calls in the history in the shape HF templates read."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.images:
            raise bad_request(f"messages[{i}].images: this model takes text only", f"messages[{i}].images")
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            msg["tool_calls"] = [{"type": "function", **({"id": t.id} if t.id else {}),
                                  "function": {"name": t.function.name, "arguments": t.function.arguments}}
                                 for t in m.tool_calls]
        if m.tool_name:
            msg["name"] = m.tool_name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.thinking:
            msg["reasoning_content"] = m.thinking
        out.append(msg)
    return out
