"""OpenAIServingCompletion: POST /v1/completions, streaming and not.

A request with P prompts and n choices runs as P engine requests (each with its own n); choice
`p * n + i` is choice i of prompt p, so indices are stable across chunks and in the final response.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tokenmill.engine.beam_search import BeamSearchParams
from tokenmill.engine.input_processor import ProcessedPrompt
from tokenmill.entrypoints.openai.protocol import (CompletionChoice, CompletionChunk, CompletionLogprobs,
                                                   CompletionRequest, CompletionResponse)
from tokenmill.entrypoints.openai.serving_engine import (SSE_DONE, AnswerOptions, OpenAIServing, merge_streams, sse,
                                                         sse_error)
from tokenmill.entrypoints.server.errors import APIError, bad_request
from tokenmill.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from tokenmill.sampling_params import SamplingParams

# Prompts one request may carry (each runs as its own engine request, times n).
MAX_PROMPTS_PER_REQUEST = 64
# OpenAI's and vLLM's default for /v1/completions without max_tokens (clamped to the rest of the context):
# one forgotten field must not tie up a slot until the context is full
DEFAULT_MAX_TOKENS = 16


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, req: CompletionRequest, raw_request: Request) -> Response | CompletionResponse:
        """Validate, then stream SSE or return the whole CompletionResponse. Raises APIError."""
        self.check_model(req.model)
        if req.suffix is not None:
            raise bad_request("suffix is not supported by this server", "suffix")
        if req.best_of is not None and req.best_of != 1:
            raise bad_request("best_of other than 1 is not supported; use n for several choices", "best_of")
        if req.max_tokens == 0 and not req.echo:
            raise bad_request("max_tokens must be at least 1 (0 is accepted with echo, to score the prompt)",
                              "max_tokens")
        # echo with logprobs scores the prompt too (what evaluation harnesses send): it needs prompt logprobs;
        # echo with max_tokens 0 gives the prompt back and generates nothing (one token runs and is dropped)
        echo_logprobs = bool(req.echo) and req.logprobs is not None
        params = self.sampling_params(req, 1 if req.max_tokens == 0 else req.max_tokens, req.logprobs,
                                      req.logprobs if echo_logprobs else None)
        beams = self.beam_search_params(req, params)
        await self.compile_structured(params)
        prompts = [self.process_prompt(p, params) for p in await self._prompt_ids(req.prompt)]
        if req.max_tokens is None:
            prompts = [dataclasses.replace(p, max_tokens=min(DEFAULT_MAX_TOKENS, p.max_tokens)) for p in prompts]
        self.check_admission()
        request_id = self.new_id("cmpl")
        self.maybe_log_prompt(request_id, req.prompt)
        echo = [self.tokenizer.decode(p.prompt_token_ids) for p in prompts] if req.echo else None
        if beams is not None:
            collect = self._collect_beams(request_id, prompts, beams, echo, AnswerOptions.of(req))
            if req.stream:
                return StreamingResponse(self._stream_whole(collect, AnswerOptions.of(req)),
                                         media_type="text/event-stream")
            result = await self.until_disconnect(collect, raw_request)
        elif req.stream:
            return StreamingResponse(self._stream(request_id, prompts, params, echo, req),
                                     media_type="text/event-stream")
        else:
            result = await self.until_disconnect(self._collect(request_id, prompts, params, echo, req), raw_request)
        return result if result is not None else Response(status_code=499)

    async def _prompt_ids(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """Every accepted prompt shape as a list of token-id lists."""
        if isinstance(prompt, str):
            return [await self.encode(prompt)]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if len(prompt) > MAX_PROMPTS_PER_REQUEST and not all(isinstance(p, int) for p in prompt):
            raise bad_request(f"prompt has {len(prompt)} prompts; at most {MAX_PROMPTS_PER_REQUEST} are allowed "
                              "per request", "prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        if all(isinstance(p, str) for p in prompt):
            return [await self.encode(p) for p in prompt]  # type: ignore[arg-type]
        if all(isinstance(p, list) for p in prompt):
            return [list(p) for p in prompt]  # type: ignore[arg-type]
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of such lists",
                          "prompt")

    def _engine_streams(self, request_id: str, prompts: list[ProcessedPrompt],
                        params: SamplingParams) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{i}" for i in range(len(prompts))]
        return merge_streams([self.generate(rid, p, params) for rid, p in zip(ids, prompts)])

    async def _collect(self, request_id: str, prompts: list[ProcessedPrompt], params: SamplingParams,
                       echo: list[str] | None, req: CompletionRequest) -> CompletionResponse:
        options = AnswerOptions.of(req)
        final: dict[int, RequestOutput] = {}
        async with contextlib.aclosing(self._engine_streams(request_id, prompts, params)) as outputs:
            async for p, out in outputs:
                if out.finished:
                    self.check_finished(out)
                    final[p] = out
        choices: list[CompletionChoice] = []
        num_completion = 0
        generate = req.max_tokens != 0
        for p in range(len(prompts)):
            out = final[p]
            for c in out.outputs:
                ids = c.token_ids if generate else []
                num_completion += len(ids)
                lps = None
                if c.logprobs is not None:
                    lps = CompletionLogprobs()
                    offset = self._prompt_part(lps, out, req.logprobs) if echo else 0
                    self._append(lps, ids, c.logprobs, offset)
                choices.append(CompletionChoice(
                    index=p * params.n + c.index, text=(echo[p] if echo else "") + (c.text if generate else ""),
                    logprobs=lps, finish_reason=c.finish_reason.value if c.finish_reason else None,
                    stop_reason=c.stop_reason,
                    prompt_logprobs=self.prompt_logprobs(out.prompt_logprobs, req.prompt_logprobs),
                    prompt_token_ids=prompts[p].prompt_token_ids if options.return_token_ids else None,
                    token_ids=ids if options.return_token_ids else None))
        return CompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                  usage=self.usage(sum(len(p.prompt_token_ids) for p in prompts), num_completion))

    async def _collect_beams(self, request_id: str, prompts: list[ProcessedPrompt], bp: BeamSearchParams,
                             echo: list[str] | None, options: AnswerOptions) -> CompletionResponse:
        """use_beam_search: each prompt's `n` best hypotheses are its choices, best first."""
        results = await asyncio.gather(*(self.beam_search(f"{request_id}-{p}", prompt, bp)
                                         for p, prompt in enumerate(prompts)))
        choices: list[CompletionChoice] = []
        for p, hyps in enumerate(results):
            for i, h in enumerate(hyps):
                choices.append(CompletionChoice(
                    index=p * bp.beam_width + i, text=(echo[p] if echo else "") + h.text,
                    finish_reason="stop" if h.finished_by_eos else "length",
                    prompt_token_ids=prompts[p].prompt_token_ids if options.return_token_ids else None,
                    token_ids=h.token_ids if options.return_token_ids else None))
        num_completion = sum(len(h.token_ids) for hyps in results for h in hyps)
        return CompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                  usage=self.usage(sum(len(p.prompt_token_ids) for p in prompts), num_completion))

    async def _stream_whole(self, collect: Awaitable[CompletionResponse], options: AnswerOptions) -> AsyncIterator[bytes]:
        """A stream of an answer made whole first (beam search knows its choices only at the end): one chunk
        per choice, then the usage if asked for."""
        try:
            whole = await collect
            for c in whole.choices:
                yield sse(CompletionChunk(id=whole.id, created=whole.created, model=whole.model, choices=[c]))
            if options.include_usage:
                yield sse(CompletionChunk(id=whole.id, created=whole.created, model=whole.model, choices=[],
                                          usage=whole.usage))
        except APIError as e:  # headers are sent: the error goes in the stream
            yield sse_error(e)
        yield SSE_DONE

    async def _stream(self, request_id: str, prompts: list[ProcessedPrompt], params: SamplingParams,
                      echo: list[str] | None, req: CompletionRequest) -> AsyncIterator[bytes]:
        created = int(time.time())
        n = params.n
        options = AnswerOptions.of(req)
        generate = req.max_tokens != 0
        # echo with logprobs waits for the prompt's logprobs (they come with its first output)
        echo_waits = echo is not None and req.logprobs is not None
        num_sent_tokens: dict[int, int] = {}  # choice -> generated tokens already reported (logprob slices, usage)
        text_offset: dict[int, int] = {}  # choice -> characters already sent
        prompt_ids_sent: set[int] = set()  # choices whose first chunk (with prompt_token_ids) has gone out

        def chunk(index: int, text: str, token_ids: list[int], logprobs: CompletionLogprobs | None = None,
                  finish: str | None = None, stop_reason: int | str | None = None) -> bytes:
            prompt_ids = prompts[index // n].prompt_token_ids
            first = index not in prompt_ids_sent
            prompt_ids_sent.add(index)
            ids = options.return_token_ids
            choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish,
                                      stop_reason=stop_reason, prompt_token_ids=prompt_ids if ids and first else None,
                                      token_ids=token_ids if ids else None)
            usage = self.usage(len(prompt_ids), num_sent_tokens.get(index, 0)) if options.continuous_usage else None
            return sse(CompletionChunk(id=request_id, created=created, model=self.served_model_name, choices=[choice],
                                       usage=usage))

        finished: set[int] = set()
        echoed: set[int] = set()  # prompts whose echo went out
        num_completion = 0
        try:
            if echo and not echo_waits:
                for p, text in enumerate(echo):
                    echoed.add(p)
                    for i in range(n):
                        text_offset[p * n + i] = len(text)
                        yield chunk(p * n + i, text, [])
            async with contextlib.aclosing(self._engine_streams(request_id, prompts, params)) as outputs:
                async for p, out in outputs:
                    if out.finished:
                        self.check_finished(out)
                    if echo and p not in echoed:
                        echoed.add(p)
                        for i in range(n):
                            lps = CompletionLogprobs()
                            text_offset[p * n + i] = self._prompt_part(lps, out, req.logprobs)
                            yield chunk(p * n + i, echo[p], [], lps)
                    for c in out.outputs:
                        index = p * n + c.index
                        if index in finished:
                            continue
                        frame = self._delta(index, c, num_sent_tokens, text_offset, chunk, options, generate)
                        if frame is not None:
                            yield frame
                        if c.finish_reason is not None:
                            finished.add(index)
                            num_completion += len(c.token_ids) if generate else 0
            if options.include_usage:
                yield sse(CompletionChunk(id=request_id, created=created, model=self.served_model_name, choices=[],
                                          usage=self.usage(sum(len(p.prompt_token_ids) for p in prompts), num_completion)))
        except APIError as e:  # headers are sent: the error goes in the stream
            yield sse_error(e)
        yield SSE_DONE

    def _delta(self, index: int, c: CompletionOutput, num_sent_tokens: dict[int, int], text_offset: dict[int, int],
               chunk: Callable[..., bytes], options: AnswerOptions, generate: bool) -> bytes | None:
        """The frame for choice `index`'s news in this output, or None when it has none (echo with
        max_tokens 0: only the finish; the one token that ran is not shown)."""
        finish = c.finish_reason.value if c.finish_reason else None
        if not generate:
            return chunk(index, "", [], None, finish) if finish else None
        start = num_sent_tokens.get(index, 0)
        new_ids = c.delta_token_ids
        num_sent_tokens[index] = start + len(new_ids)
        lps = None
        if c.logprobs is not None and new_ids:
            lps = CompletionLogprobs()
            self._append(lps, new_ids, c.logprobs[start:start + len(new_ids)], text_offset.get(index, 0))
        # a chunk for news only; new ids alone are news when the client asked for them
        if not (c.delta_text or lps is not None or finish is not None or (options.return_token_ids and new_ids)):
            return None
        text_offset[index] = text_offset.get(index, 0) + len(c.delta_text)
        return chunk(index, c.delta_text, new_ids, lps, finish, c.stop_reason if finish else None)

    def _append(self, out: CompletionLogprobs, token_ids: list[int], logprobs: list[TokenLogprobs], offset: int) -> int:
        """Add these generated tokens in the completions logprobs shape; offsets count characters from
        `offset`. Returns the offset after them."""
        for tok, lp in zip(token_ids, logprobs):
            text = self.token_text(tok)
            out.tokens.append(text)
            out.token_logprobs.append(self.clamp_logprob(lp.logprob))
            top = {self.token_text(t.token_id): self.clamp_logprob(t.logprob) for t in lp.top}
            top.setdefault(text, self.clamp_logprob(lp.logprob))
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return offset

    def _prompt_part(self, out: CompletionLogprobs, result: RequestOutput, n_top: int | None) -> int:
        """Echo: the prompt's tokens first, in OpenAI's shape (the first token has null logprobs; its top
        alternatives too). Without logprobs asked, nothing. Returns the offset after the prompt."""
        entries = result.prompt_logprobs
        if n_top is None or entries is None:
            return 0
        offset = 0
        for tok, e in zip(result.prompt_token_ids, entries):
            text = self.token_text(tok)
            out.tokens.append(text)
            out.text_offset.append(offset)
            offset += len(text)
            if e is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(self.clamp_logprob(e.logprob))
            top = {self.token_text(t.token_id): self.clamp_logprob(t.logprob) for t in e.top[:n_top]}
            top.setdefault(text, self.clamp_logprob(e.logprob))
            out.top_logprobs.append(top)
        return offset
