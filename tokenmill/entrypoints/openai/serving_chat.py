"""OpenAIServingChat: POST /v1/chat/completions, streaming and not.

Messages are rendered with the model's chat template and tokenized on a worker thread. Streaming sends,
per choice, a first chunk with `role: assistant` (sent once the first token exists), then content deltas,
then a chunk with its finish_reason.

Tool calling (tool_calling.py, tool_prompt.py, tool_parsers/): the request's tools go to the chat template,
or into the fallback prompt for a template that renders none; a forced tool_choice constrains the output;
each choice's text is then read as content and tool calls, and a stream sends the calls as OpenAI's
`tool_calls` deltas as they complete (a named function's arguments as they are written). finish_reason is
"tool_calls" when an answer that stopped made calls, except under a named tool_choice, where it stays "stop"
(as OpenAI and vLLM answer a forced function).

A model that speaks gpt-oss's harmony format (harmony.py: its chat template writes harmony's messages, or
--reasoning-parser openai_gptoss / --tool-call-parser openai) has its answers read as harmony: the analysis
channel is the reasoning, the final channel (and preambles) the content, messages to functions.NAME the
tool calls; the text keeps its special tokens for that, and the request's skip_special_tokens governs only
the vocabulary's other special tokens. A forced tool_choice's answer is the constrained JSON, read as before.

vLLM's extras: `continue_final_message` renders the conversation with its final (assistant) message left
open, so the model continues it; `echo` starts the answer (a stream: its first chunk) with the final
message's content when that message is the assistant's, the role this server always generates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tokenmill.engine.beam_search import BeamSearchParams
from tokenmill.engine.input_processor import ProcessedPrompt
from tokenmill.entrypoints.openai.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                                   ChatCompletionRequest, ChatCompletionResponse,
                                                   ChatCompletionTool, ChatDelta,
                                                   ChatLogprobs, ChatMessage, ChatResponseMessage, ChatTokenLogprob,
                                                   ChatTopLogprob, DeltaFunctionCall, DeltaToolCall,
                                                   NamedToolChoice, ToolCall, ToolCallFunction, join_text_parts)
from tokenmill.entrypoints.openai.harmony import (Harmony, HarmonyReader, HarmonyStream, harmony_history,
                                                  harmony_tools)
from tokenmill.entrypoints.openai.serving_engine import SSE_DONE, AnswerOptions, OpenAIServing, sse, sse_error
from tokenmill.entrypoints.openai.reasoning import ReasoningStream, starts_inside
from tokenmill.entrypoints.openai.reasoning import split as split_reasoning
from tokenmill.entrypoints.openai.tool_calling import ToolCalling
from tokenmill.entrypoints.openai.tool_parsers import StreamDelta, ToolCallStream, ToolFormat
from tokenmill.entrypoints.openai.tool_prompt import ToolPrompt
from tokenmill.entrypoints.server.errors import APIError, bad_request
from tokenmill.outputs import RequestOutput, TokenLogprobs
from tokenmill.sampling_params import MAX_LOGPROBS, ParamError, SamplingParams
from tokenmill.tokenizer.chat_template import ChatTemplateSecurityError


def messages_for_template(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template; list content becomes its text parts joined. 400 on other parts."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            try:
                content = join_text_parts(content, f"messages[{i}].content")
            except ParamError as e:
                raise bad_request(e.message, e.field) from None
        if m.audio is not None:
            raise bad_request(f"messages[{i}].audio: audio is not supported (this server answers in text)",
                              f"messages[{i}].audio")
        if content is None and m.refusal is not None and m.role == "assistant":  # OpenAI's refusal turn
            content = m.refusal
        msg: dict[str, Any] = {"role": m.role, "content": content if content is not None else ""}
        for key in ("name", "tool_call_id"):
            if getattr(m, key) is not None:
                msg[key] = getattr(m, key)
        calls = [c.model_dump() for c in m.tool_calls or []]
        if m.function_call is not None and m.role == "assistant":  # the deprecated form of one call
            calls.append({"id": f"call_{i}", "type": "function", "function": m.function_call.model_dump()})
        if calls:
            msg["tool_calls"] = calls
        thought = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if thought is not None and m.role == "assistant":
            msg["reasoning_content"] = thought
        out.append(msg)
    return out


def _calls_finish(finish: str | None, calling: ToolCalling | None) -> str | None:
    """The finish_reason of an answer that made calls: "tool_calls" where it stopped, but "stop" under a
    named tool_choice (OpenAI's and vLLM's answer to a forced function)."""
    if finish != "stop" or (calling is not None and calling.named is not None):
        return finish
    return "tool_calls"


class OpenAIServingChat(OpenAIServing):
    def __init__(self, *args: Any, tool_call_parser: str = "auto", reasoning_parser: str | None = None,
                 **kwargs: Any) -> None:
        """OpenAIServing's arguments; `tool_call_parser`: --tool-call-parser (a format name, or "auto");
        `reasoning_parser`: --reasoning-parser (None: reasoning stays in the content)."""
        super().__init__(*args, **kwargs)
        self.tool_prompt = ToolPrompt(self.tokenizer, tool_call_parser)
        self.reasoning_parser = reasoning_parser
        self.harmony = Harmony.of(self.tokenizer, reasoning_parser, tool_call_parser)  # None: not a harmony model

    def starts_in_reasoning(self, prompt_ids: list[int], params: SamplingParams) -> bool | None:
        """None without a <think> reasoning parser (or for a harmony model, read otherwise); else whether
        the answer starts inside a <think> block."""
        if self.reasoning_parser is None or self.harmony is not None:
            return None
        return starts_inside(self.tokenizer, prompt_ids, params.structured_outputs is not None)

    async def create_chat_completion(self, req: ChatCompletionRequest,
                                     raw_request: Request) -> Response | ChatCompletionResponse:
        """Validate, render, then stream SSE or return the whole ChatCompletionResponse. Raises APIError."""
        self.check_model(req.model)
        for name, what in (("verbosity", "a GPT-5 setting"),
                           ("prediction", "predicted outputs (see --speculative-config for n-gram speculation, which "
                                          "drafts from the prompt)"),
                           ("audio", "audio output")):
            if getattr(req, name) is not None:
                raise bad_request(f"{name} is not supported by this server ({what}): leave it out or null", name)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
                              "top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, logprobs)
        calling = self._tool_calling(req, params)
        harmony = self.harmony_reader(params, calling, req.skip_special_tokens is not False)
        beams = self.beam_search_params(req, params)
        if beams is not None and calling is not None and calling.mode != "none":
            raise bad_request("tools cannot be used with use_beam_search (set tool_choice to \"none\")",
                              "use_beam_search")
        await self.compile_structured(params)
        if not req.messages:
            raise bad_request("messages must not be empty", "messages")
        prompt = self.process_prompt(await self.render(req.messages, req.add_generation_prompt,
                                                       req.continue_final_message, calling,
                                                       self._template_kwargs(req)), params, "messages")
        model_max = self.engine.sampling_defaults.max_tokens
        if max_tokens is None and model_max is not None:  # the model's max_new_tokens, within the context
            prompt = dataclasses.replace(prompt, max_tokens=min(model_max, prompt.max_tokens))
        self.check_admission()
        request_id = self.new_id("chatcmpl")
        self.maybe_log_prompt(request_id, [m.model_dump(exclude_none=True) for m in req.messages])
        echo = self._echo(req)
        options = AnswerOptions.of(req)
        reasoning = self.starts_in_reasoning(prompt.prompt_token_ids, params)
        if beams is not None:
            collect = self._collect_beams(request_id, prompt, beams, echo, options, reasoning, harmony)
            if req.stream:
                return StreamingResponse(self._stream_whole(collect, options), media_type="text/event-stream")
            result = await self.until_disconnect(collect, raw_request)
            return result if result is not None else Response(status_code=499)
        if req.stream:
            return StreamingResponse(self._stream(request_id, prompt, params, echo, options, calling, reasoning,
                                                  harmony), media_type="text/event-stream")
        result = await self.until_disconnect(self._collect(request_id, prompt, params, echo, options, calling,
                                                           reasoning, harmony), raw_request)
        return result if result is not None else Response(status_code=499)

    @staticmethod
    def _template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
        """chat_template_kwargs, with OpenAI's reasoning_effort as the template variable of that name (as
        gpt-oss's templates read it) unless chat_template_kwargs sets it."""
        if req.reasoning_effort is None:
            return req.chat_template_kwargs
        return {"reasoning_effort": req.reasoning_effort, **(req.chat_template_kwargs or {})}

    async def render(self, messages: list[ChatMessage], add_generation_prompt: bool | None = None,
                     continue_final_message: bool | None = False, calling: ToolCalling | None = None,
                     template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Chat template + tokenize (the engine's InputProcessor), on a worker thread; the tools and the
        history's calls as the template takes them (ToolPrompt).

        `add_generation_prompt` None means true unless `continue_final_message`; both true is a 400 (vLLM's
        wording), and so is continuing a final message that is not the assistant's. A template that rejects
        the conversation (e.g. its `raise_exception`) is a 400 on `messages`; one the sandbox refused is the
        model's fault, not the request's: a 500 that says so. `template_kwargs` (vLLM's chat_template_kwargs)
        are further template variables; one that would replace the render's own is a 400 naming the field.
        """
        is_continued = bool(continue_final_message)
        if is_continued and add_generation_prompt:
            raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                              "continue_final_message")
        if is_continued and messages and messages[-1].role != "assistant":
            raise bad_request(f"continue_final_message continues the final message, which must be the assistant's; "
                              f"messages[{len(messages) - 1}] has role {messages[-1].role!r}", "continue_final_message")
        add_generation_prompt = not is_continued if add_generation_prompt is None else add_generation_prompt
        plain, tools = self.tool_prompt.prepare(messages_for_template(messages), calling)
        if self.harmony is not None:
            plain, tools = harmony_history(plain), harmony_tools(tools)

        try:
            return await asyncio.to_thread(self.input_processor.render_chat_ids, plain, add_generation_prompt, tools,
                                           continue_final_message=is_continued, template_kwargs=template_kwargs)
        except ChatTemplateSecurityError as e:
            raise APIError(500, f"the model's chat template was refused and nothing it attempted ran ({e}); "
                                "chat cannot be served with this template, completions still work") from None
        except ParamError as e:  # the template's on messages, or a bad chat_template_kwargs
            raise bad_request(e.message, e.field) from None

    def check_template(self) -> str | None:
        """Render a one-message conversation once at start: the problem, if the sandbox refuses the template."""
        if not self.tokenizer.chat_template:
            return None
        try:
            self.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
        except ChatTemplateSecurityError as e:
            return f"the model's chat template was refused ({e}); /v1/chat/completions will answer 500"
        except ValueError:  # a template may reject this probe conversation; real requests will tell
            pass
        return None

    @staticmethod
    def _echo(req: ChatCompletionRequest) -> str:
        """With `echo`: the final message's content when that message is the assistant's, else ""."""
        if not req.echo or not req.messages or req.messages[-1].role != "assistant":
            return ""
        return str(messages_for_template(req.messages[-1:])[0]["content"])

    def tool_calling(self, tools: list[ChatCompletionTool] | None, tool_choice: str | NamedToolChoice | None = None,
                     parallel_tool_calls: bool | None = None) -> ToolCalling | None:
        """The request's tool calling (None without tools); a 400 naming the field at fault."""
        try:
            return ToolCalling.of(tools, tool_choice, parallel_tool_calls, self.tool_prompt.format)
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    def _tool_calling(self, req: ChatCompletionRequest, params: SamplingParams) -> ToolCalling | None:
        """`tool_calling` of the request; a forced tool_choice's constraint goes on `params`, and "auto"
        keeps special tokens in the text when the format's markers are special."""
        calling = self.tool_calling(req.tools, req.tool_choice, req.parallel_tool_calls)
        if calling is None:
            return None
        constraint = calling.constraint()
        if constraint is not None:
            if params.structured_outputs is not None:
                raise bad_request(f"tool_choice {calling.mode!r} constrains the output to tool calls, so it cannot "
                                  "be combined with response_format or structured_outputs", "tool_choice")
            params.structured_outputs = constraint
        if calling.mode == "auto" and not calling.format.skip_special_tokens:
            params.skip_special_tokens = False
        return calling

    def harmony_reader(self, params: SamplingParams, calling: ToolCalling | None,
                       skip_special_tokens: bool) -> HarmonyReader | None:
        """How a harmony model's answer to this request is read (None: not a harmony model, or a forced
        tool_choice, whose constrained answer is read as such); the text then keeps its special tokens.
        `skip_special_tokens`: the request's, which drops the vocabulary's other special tokens."""
        if self.harmony is None or (calling is not None and calling.mode in ("required", "named")):
            return None
        params.skip_special_tokens = False  # the markers are special tokens
        if calling is None or calling.mode == "none":
            return self.harmony.reader(None, None, skip_special_tokens)
        return self.harmony.reader(calling.accepts, None if calling.is_parallel else 1, skip_special_tokens)

    async def _collect_beams(self, request_id: str, prompt: ProcessedPrompt, bp: BeamSearchParams, echo: str,
                             options: AnswerOptions, reasoning: bool | None,
                             harmony: HarmonyReader | None = None) -> ChatCompletionResponse:
        """use_beam_search: the `n` best hypotheses are the choices, best first."""
        hyps = await self.beam_search(request_id, prompt, bp, skip_special_tokens=harmony is None)
        ids = options.return_token_ids
        choices = [ChatChoice(index=i, message=self._message(h.text, echo, None, None, reasoning,
                                                             options.include_reasoning, harmony)[0],
                              finish_reason="stop" if h.finished_by_eos else "length",
                              token_ids=h.token_ids if ids else None) for i, h in enumerate(hyps)]
        return ChatCompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                      usage=self.usage(len(prompt.prompt_token_ids), sum(len(h.token_ids) for h in hyps)),
                                      prompt_token_ids=prompt.prompt_token_ids if ids else None)

    async def _stream_whole(self, collect: Awaitable[ChatCompletionResponse],
                            options: AnswerOptions) -> AsyncIterator[bytes]:
        """A stream of an answer made whole first (beam search knows its choices only at the end): per
        choice a role chunk with all its content, then a finish chunk; then the usage if asked for."""
        try:
            whole = await collect
            for c in whole.choices:
                first = ChatDelta(role="assistant", content=c.message.content, reasoning=c.message.reasoning,
                                  reasoning_content=c.message.reasoning_content)
                for delta, finish in ((first, None),
                                      (ChatDelta(), c.finish_reason)):
                    yield sse(ChatCompletionChunk(id=whole.id, created=whole.created, model=whole.model, choices=[
                        ChatChunkChoice(index=c.index, delta=delta, finish_reason=finish,
                                        token_ids=c.token_ids if finish is None else None)]))
            if options.include_usage:
                yield sse(ChatCompletionChunk(id=whole.id, created=whole.created, model=whole.model, choices=[],
                                              usage=whole.usage))
        except APIError as e:  # headers are sent: the error goes in the stream
            yield sse_error(e)
        yield SSE_DONE

    async def _collect(self, request_id: str, prompt: ProcessedPrompt, params: SamplingParams, echo: str,
                       options: AnswerOptions, calling: ToolCalling | None, reasoning: bool | None,
                       harmony: HarmonyReader | None = None) -> ChatCompletionResponse:
        final: RequestOutput | None = None
        async with contextlib.aclosing(self.generate(request_id, prompt, params)) as outputs:
            async for out in outputs:
                if out.finished:
                    self.check_finished(out)
                    final = out
        assert final is not None  # generate ends only after the finished output
        ids = options.return_token_ids
        choices = []
        for c in final.outputs:
            message, finish = self._message(c.text, echo, c.finish_reason.value if c.finish_reason else None, calling,
                                            reasoning, options.include_reasoning, harmony)
            choices.append(ChatChoice(index=c.index, message=message, finish_reason=finish, stop_reason=c.stop_reason,
                                      logprobs=self._logprobs(c.token_ids, c.logprobs) if c.logprobs is not None
                                      else None, token_ids=c.token_ids if ids else None))
        num_completion = sum(len(c.token_ids) for c in final.outputs)
        return ChatCompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                      usage=self.usage(len(prompt.prompt_token_ids), num_completion,
                                                       final.metrics.num_cached_tokens if final.metrics else None),
                                      prompt_logprobs=self.prompt_logprobs(final.prompt_logprobs,
                                                                           params.prompt_logprobs),
                                      prompt_token_ids=prompt.prompt_token_ids if ids else None)

    @staticmethod
    def _message(text: str, echo: str, finish: str | None, calling: ToolCalling | None,
                 reasoning: bool | None = None, include_reasoning: bool = True,
                 harmony: HarmonyReader | None = None) -> tuple[ChatResponseMessage, str | None]:
        """A choice's message and finish_reason: its text read as reasoning (`reasoning` not None: the
        parser is on, and True: the answer starts inside the block; shown under both names unless not
        `include_reasoning`), then content and calls when it has tools; or, for a harmony model
        (`harmony`), read as harmony's messages."""
        thought = None
        if reasoning is not None:
            thought, text = split_reasoning(text, reasoning)
        answer = harmony.parse(text, cut=finish == "length") if harmony is not None else None
        if answer is not None:
            thought = answer.reasoning
        shown = thought if include_reasoning else None

        def message(content: str | None, tool_calls: list[ToolCall] | None = None) -> ChatResponseMessage:
            return ChatResponseMessage(content=content, reasoning=shown, reasoning_content=shown, tool_calls=tool_calls)

        if answer is not None:
            new_id = calling.format.new_call_id if calling is not None else ToolFormat.new_call_id
            calls = [ToolCall(id=new_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments))
                     for c in answer.tool_calls]
            if not calls:
                return message(echo + answer.content), finish
            return message(echo + answer.content or None, calls), _calls_finish(finish, calling)
        if calling is None or calling.mode == "none":
            return message(echo + text), finish
        parsed = calling.parse(text)
        calls = [ToolCall(id=calling.format.new_call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments))
                 for c in parsed.tool_calls]
        if not calls:
            return message(echo + parsed.content), finish
        return message(echo + parsed.content or None, calls), _calls_finish(finish, calling)

    async def _stream(self, request_id: str, prompt: ProcessedPrompt, params: SamplingParams, echo: str,
                      options: AnswerOptions, calling: ToolCalling | None, reasoning: bool | None,
                      harmony: HarmonyReader | None = None) -> AsyncIterator[bytes]:
        created = int(time.time())
        num_prompt = len(prompt.prompt_token_ids)
        num_sent_tokens = [0] * params.n  # choice -> generated tokens already reported (logprob slices, usage)

        def chunk(choice: ChatChunkChoice, is_first: bool = False) -> bytes:
            """`is_first`: the choice's role chunk, which carries the prompt's ids when asked for."""
            usage = self.usage(num_prompt, num_sent_tokens[choice.index]) if options.continuous_usage else None
            prompt_ids = prompt.prompt_token_ids if is_first and options.return_token_ids else None
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.served_model_name,
                                           choices=[choice], usage=usage, prompt_token_ids=prompt_ids))

        ids = options.return_token_ids
        finished: set[int] = set()
        num_completion = 0
        cached: int | None = None  # prompt tokens the prefix cache held (known once the request finishes)
        streams = ([ToolCallStream(calling.parser(), calling.format.new_call_id) for _ in range(params.n)]
                   if calling is not None and calling.mode != "none" and harmony is None else None)
        thinking = [ReasoningStream(reasoning) for _ in range(params.n)] if reasoning is not None else None
        messages = [harmony.stream() for _ in range(params.n)] if harmony is not None else None
        new_call_id = calling.format.new_call_id if calling is not None else ToolFormat.new_call_id
        try:
            role_sent = False
            async with contextlib.aclosing(self.generate(request_id, prompt, params)) as outputs:
                async for out in outputs:
                    if not role_sent:  # with the first output, as vLLM does: a client's TTFT includes prefill
                        role_sent = True
                        for i in range(params.n):
                            yield chunk(ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=echo),
                                                        token_ids=[] if ids else None), is_first=True)
                    if out.finished:
                        self.check_finished(out)
                        cached = out.metrics.num_cached_tokens if out.metrics else None
                    for c in out.outputs:
                        if c.index in finished:
                            continue
                        start = num_sent_tokens[c.index]
                        new_ids = c.delta_token_ids
                        num_sent_tokens[c.index] = start + len(new_ids)
                        lps = None
                        if c.logprobs is not None and new_ids:
                            lps = self._logprobs(new_ids, c.logprobs[start:start + len(new_ids)])
                        finish = c.finish_reason.value if c.finish_reason else None
                        text, thought = c.delta_text, None
                        if thinking is not None:  # the reasoning first: only the rest is content (and calls)
                            thought, text = thinking[c.index].feed(text, is_final=finish is not None)
                        if messages is not None:  # harmony: reasoning, content and calls in one reading
                            delta, thought = self._harmony_delta(messages[c.index], text, finish,
                                                                 new_call_id)
                            finish = _calls_finish(finish, calling) if messages[c.index].num_calls else finish
                        elif streams is None:
                            delta = ChatDelta(content=text) if text else ChatDelta()
                        else:
                            stream = streams[c.index]
                            delta = self._tool_delta(stream.feed(text, is_final=finish is not None))
                            finish = _calls_finish(finish, calling) if stream.num_calls else finish
                        delta.reasoning = delta.reasoning_content = (thought or None) if options.include_reasoning else None
                        # a chunk for news only; new ids alone are news when the client asked for them
                        if (delta.content or delta.tool_calls or delta.reasoning_content or lps is not None
                                or finish is not None or (ids and new_ids)):
                            yield chunk(ChatChunkChoice(
                                index=c.index, delta=delta, logprobs=lps, finish_reason=finish,
                                stop_reason=c.stop_reason if finish else None, token_ids=new_ids if ids else None))
                        if finish is not None:
                            finished.add(c.index)
                            num_completion += len(c.token_ids)
            if options.include_usage:
                yield sse(ChatCompletionChunk(id=request_id, created=created, model=self.served_model_name,
                                              choices=[], usage=self.usage(num_prompt, num_completion, cached)))
        except APIError as e:  # headers are sent: the error goes in the stream
            yield sse_error(e)
        yield SSE_DONE

    @staticmethod
    def _harmony_delta(stream: HarmonyStream, text: str, finish: str | None,
                       new_call_id: Callable[[], str]) -> tuple[ChatDelta, str]:
        """A harmony stream's news for `text` (`finish`: the choice's finish_reason, None before its end) as a
        chunk's delta (its calls whole), and the reasoning."""
        news = stream.feed(text, finish is not None, cut=finish == "length")
        first = stream.num_calls - len(news.tool_calls)  # the index of the first call completed now
        calls = [DeltaToolCall(index=first + i, id=new_call_id(), type="function",
                               function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
                 for i, c in enumerate(news.tool_calls)]
        return ChatDelta(content=news.content or None, tool_calls=calls or None), news.reasoning

    @staticmethod
    def _tool_delta(news: StreamDelta) -> ChatDelta:
        """A ToolCallStream's news as a chunk's delta: a call's first piece with its id, type and name."""
        calls = [DeltaToolCall(index=d.index, id=d.id, type="function" if d.id is not None else None,
                               function=DeltaFunctionCall(name=d.name, arguments=d.arguments)) for d in news.tool_calls]
        return ChatDelta(content=news.content or None, tool_calls=calls or None)

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs]) -> ChatLogprobs:
        """The chat logprobs shape: one entry per token with its top alternatives."""
        content = []
        for tok, lp in zip(token_ids, logprobs):
            text = self.token_text(tok)
            top = [ChatTopLogprob(token=self.token_text(t.token_id), logprob=self.clamp_logprob(t.logprob),
                                  bytes=self.token_bytes(t.token_id)) for t in lp.top]
            content.append(ChatTokenLogprob(token=text, logprob=self.clamp_logprob(lp.logprob),
                                            bytes=self.token_bytes(tok), top_logprobs=top))
        return ChatLogprobs(content=content)
