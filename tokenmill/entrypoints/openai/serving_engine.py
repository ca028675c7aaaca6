"""OpenAIServing: what the completions and chat endpoints share.

Admission (the server's, server/admission.py: draining, engine death, queue limit), model-name checks,
building SamplingParams from request fields, tokenizing off the event loop, the engine's InputProcessor
(truncate, validate against the context: a ParamError's `field` is the error's `param`), running a
request with client-disconnect detection and the optional per-request deadline, logprob token strings,
and SSE framing.

Prompt text is never logged unless the operator asked for it (`log_prompts`, the --log-prompts flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from tokenmill.engine.async_engine import AsyncEngine, EngineDeadError, RequestTimeoutError
from tokenmill.engine.beam_search import BeamSearch, BeamSearchParams, Hypothesis
from tokenmill.engine.input_processor import ProcessedPrompt
from tokenmill.entrypoints.openai.protocol import PromptLogprob, PromptLogprobs, PromptTokensDetails, SamplingFields, Usage
from tokenmill.entrypoints.server.admission import Admission, ServerState
from tokenmill.entrypoints.server.errors import APIError, bad_request, error_body
from tokenmill.metrics import ModelMetrics, ServerMetrics
from tokenmill.outputs import FinishReason, RequestOutput, TokenLogprobs
from tokenmill.sampling_params import ParamError, SamplingParams, StructuredOutputsParams

log = logging.getLogger("tokenmill.server")
T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"
_MIN_LOGPROB = -9999.0  # JSON has no -inf: a token with probability 0 reports this
_MAX_LOGGED_PROMPT_CHARS = 4096  # --log-prompts: longer prompts are cut, with their length noted


@dataclass(frozen=True)
class AnswerOptions:
    """What a request asked its answer to carry besides the text (the same for both endpoints)."""

    include_usage: bool = False  # streamed: a last chunk with the whole request's usage
    continuous_usage: bool = False  # streamed: every choice chunk carries its choice's usage so far
    return_token_ids: bool = False  # prompt_token_ids, and each choice's token_ids
    include_reasoning: bool = True  # chat with --reasoning-parser: the reasoning in the answer (vLLM's field)

    @classmethod
    def of(cls, req: SamplingFields) -> AnswerOptions:
        """vLLM's rule: continuous_usage_stats counts only together with include_usage."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = include_usage and bool(req.stream_options and req.stream_options.continuous_usage_stats)
        return cls(include_usage, continuous, bool(req.return_token_ids),
                   getattr(req, "include_reasoning", True) is not False)


class OpenAIServing:
    def __init__(self, async_engine: AsyncEngine, served_model_name: str, metrics: ModelMetrics | ServerMetrics | None,
                 state: ServerState, max_waiting_requests: int | None = None, *,
                 request_timeout: float | None = None, log_prompts: bool = False,
                 admission: Admission | None = None, accepts: Callable[[str], bool] | None = None,
                 served_names: list[str] | None = None) -> None:
        """`admission`: the model's Admission (one is made from `state` and the limit if not given);
        `accepts`: whether a request's `model` names this model (default: its served name or its own);
        `served_names`: every model the server serves, for the 404 (default: this one)."""
        self.async_engine = async_engine
        self.engine = async_engine.engine
        self.tokenizer = self.engine.tokenizer
        self.input_processor = self.engine.input_processor
        self.vocab_size: int = self.engine.model_config.vocab_size
        self.max_model_len: int = self.engine.max_model_len
        self.served_model_name = served_model_name
        self.metrics = metrics
        self.state = state
        self.admission = admission or Admission(async_engine, state, max_waiting_requests)
        self.request_timeout = request_timeout  # seconds from admission to the last token; None: no deadline
        self.log_prompts = log_prompts
        self.accepts = accepts or (lambda name: name in (self.served_model_name, self.engine.model_name))
        self.served_names = served_names or [served_model_name]

    # -- admission -------------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        """Raise 404 unless `model` is absent or names this model (`accepts`)."""
        if model is not None and not self.accepts(model):
            raise model_not_found(model, self.served_names)

    def check_admission(self) -> None:
        """Raise 503 while draining, after engine death, or when too many requests already wait."""
        self.admission.check()

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    # -- request -> engine inputs ----------------------------------------------------------------------
    def sampling_params(self, req: SamplingFields, max_tokens: int | None, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams from the request fields; a bad value is a 400 naming its field. `prompt_logprobs`:
        what the endpoint needs beyond the request's own field (completions' echo with logprobs)."""
        if req.stream_options is not None and not req.stream:  # vLLM's wording; OpenAI also answers 400
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        if req.prompt_logprobs is not None and req.stream:  # vLLM's wording
            raise bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if req.prompt_logprobs is not None:
            prompt_logprobs = max(req.prompt_logprobs, prompt_logprobs or 0)
        bias: dict[int, float] | None = None
        if req.logit_bias:
            bad = [key for key in req.logit_bias if not key.lstrip("-").isdigit()]
            if bad:
                raise bad_request(f"logit_bias: keys must be token ids, got {', '.join(map(repr, bad))}", "logit_bias")
            bias = {int(key): value for key, value in req.logit_bias.items()}
        d = self.engine.sampling_defaults  # the model's own, where the request leaves a field out
        top_k = d.pick("top_k", req.top_k, 0)
        try:
            return SamplingParams(
                n=1 if req.n is None else req.n,
                temperature=d.pick("temperature", req.temperature, 1.0),
                top_p=d.pick("top_p", req.top_p, 1.0),
                top_k=min(top_k, self.vocab_size),  # a k past the vocabulary means "all of it"
                min_p=d.pick("min_p", req.min_p, 0.0),
                seed=req.seed,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=d.pick("repetition_penalty", req.repetition_penalty, 1.0),
                logit_bias=bias,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens or 0,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=bool(req.ignore_eos),
                include_stop_str_in_output=bool(req.include_stop_str_in_output),
                skip_special_tokens=req.skip_special_tokens is not False,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                truncation_side=req.truncation_side or "left",
                structured_outputs=self.structured_outputs(req),
                cache_salt=req.cache_salt,
            )
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    @staticmethod
    def structured_outputs(req: SamplingFields) -> StructuredOutputsParams | None:
        """The output constraint a request asks for, from whichever one of its fields carries it:
        response_format (OpenAI), structured_outputs (vLLM) or guided_* (vLLM's older names)."""
        given: list[tuple[str, StructuredOutputsParams]] = []
        rf = req.response_format
        if rf is not None and rf.type != "text":
            if rf.type == "json_schema":
                if rf.json_schema is None:
                    raise bad_request("response_format: type 'json_schema' needs a json_schema", "response_format")
                schema = rf.json_schema.schema_
                given.append(("response_format", StructuredOutputsParams(json=schema, source="response_format")
                              if schema is not None else StructuredOutputsParams(json_object=True,
                                                                                  source="response_format")))
            else:
                if rf.json_schema is not None:
                    raise bad_request(f"response_format: json_schema only goes with type 'json_schema', got type "
                                      f"{rf.type!r}", "response_format")
                given.append(("response_format", StructuredOutputsParams(json_object=True, source="response_format")))
        so = req.structured_outputs
        if so is not None:
            given.append(("structured_outputs", StructuredOutputsParams(
                json=so.json_, json_object=so.json_object, regex=so.regex, choice=so.choice, grammar=so.grammar,
                disable_any_whitespace=bool(so.disable_any_whitespace), whitespace_pattern=so.whitespace_pattern)))
        guided: dict[str, Any] = {"json": req.guided_json, "regex": req.guided_regex, "choice": req.guided_choice,
                                  "grammar": req.guided_grammar}
        named = [k for k, v in guided.items() if v is not None]
        if len(named) > 1:
            raise bad_request(f"give at most one of {', '.join('guided_' + k for k in named)}", f"guided_{named[1]}")
        if req.guided_whitespace_pattern is not None and named != ["json"]:
            raise bad_request("guided_whitespace_pattern only applies with guided_json", "guided_whitespace_pattern")
        if named:
            kind = named[0]
            given.append((f"guided_{kind}", StructuredOutputsParams(
                **{kind: guided[kind]}, whitespace_pattern=req.guided_whitespace_pattern, source=f"guided_{kind}")))
        if len(given) > 1:
            raise bad_request(f"give one output constraint, got {' and '.join(name for name, _ in given)}", given[1][0])
        return given[0][1] if given else None

    async def compile_structured(self, params: SamplingParams) -> None:
        """Compile the request's output constraint off the event loop (llguidance drops the GIL while it
        compiles, so other requests keep running); one that does not compile is a 400 naming the field.
        Compiled grammars are cached: the engine's add_request then finds it ready."""
        if params.structured_outputs is None:
            return
        try:
            await asyncio.to_thread(self.engine.structured.compile, params.structured_outputs)
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    @staticmethod
    def beam_search_params(req: SamplingFields, params: SamplingParams) -> BeamSearchParams | None:
        """vLLM's use_beam_search: the beam search to run (n beams, max_tokens, length_penalty,
        early_stopping, ignore_eos), or None. Sampling fields that beam search would not honour are a 400
        naming them, as are length_penalty and early_stopping without it."""
        if not req.use_beam_search:
            for name, neutral in (("length_penalty", 1.0), ("early_stopping", False)):
                if getattr(req, name) not in (None, neutral):
                    raise bad_request(f"{name} only applies with use_beam_search", name)
            return None
        unsupported = {
            "temperature": req.temperature not in (None, 0.0), "top_p": params.top_p < 1.0,
            "top_k": params.top_k > 0, "min_p": params.min_p > 0.0,
            "presence_penalty": params.presence_penalty != 0.0, "frequency_penalty": params.frequency_penalty != 0.0,
            "repetition_penalty": params.repetition_penalty != 1.0, "logit_bias": bool(params.logit_bias),
            "stop": bool(params.stop_strings), "stop_token_ids": bool(params.stop_token_ids),
            "min_tokens": params.min_tokens > 0, "logprobs": params.logprobs is not None,
            "prompt_logprobs": params.prompt_logprobs is not None,
            "structured_outputs": params.structured_outputs is not None,
        }
        for name, bad in unsupported.items():
            if bad:
                raise bad_request(f"{name} is not supported with use_beam_search (beam search is deterministic: it "
                                  "keeps the n most likely continuations)", name)
        try:
            return BeamSearchParams(params.n, params.max_tokens or 1 << 30, 1.0 if req.length_penalty is None
                                    else req.length_penalty, bool(req.early_stopping) if req.early_stopping != "never"
                                    else "never", params.ignore_eos)
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize on a worker thread so long prompts do not stall the event loop."""
        return await asyncio.to_thread(self.input_processor.tokenize, text, add_special_tokens)

    def process_prompt(self, prompt_ids: list[int], params: SamplingParams,
                       prompt_field: str = "prompt") -> ProcessedPrompt:
        """Truncate and validate through the engine's InputProcessor; 400 naming the field at fault.

        `prompt_field` is the request field a bad prompt is blamed on (`messages` for chat)."""
        try:
            return self.input_processor.process(prompt_ids, params, prompt_field)
        except ParamError as e:
            raise bad_request(e.message, e.field) from None

    def maybe_log_prompt(self, request_id: str, prompt: Any) -> None:
        """Log the prompt text of a request, only when the operator set --log-prompts."""
        if not self.log_prompts:
            return
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)
        if len(text) > _MAX_LOGGED_PROMPT_CHARS:
            text = f"{text[:_MAX_LOGGED_PROMPT_CHARS]}... ({len(text)} characters)"
        log.info("request %s prompt: %s", request_id, text)

    # -- running ---------------------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt: ProcessedPrompt,
                       params: SamplingParams) -> AsyncGenerator[RequestOutput, None]:
        """The engine's outputs for one request. Failures become APIErrors for this request alone.

        Closing or cancelling the iteration aborts the request in the engine (AsyncEngine's contract).
        """
        self.state.in_flight.add(request_id)
        try:
            # stream=True even for non-streaming responses: per-step outputs time inter-token latency
            stream = self.async_engine.generate(request_id, prompt, params, stream=True,
                                                timeout=self.request_timeout)
            async with contextlib.aclosing(stream) as outputs:  # type: ignore[type-var]
                async for out in outputs:
                    yield out
        except RequestTimeoutError as e:
            raise APIError(408, f"{e} (the server's --request-timeout is {self.request_timeout:g}s; "
                                f"{e.num_output_tokens} tokens had been generated)") from None
        except EngineDeadError as e:
            if self.metrics is not None:
                self.metrics.on_request_error()
            raise APIError(503 if self.state.is_draining else 500, str(e)) from None
        except ValueError as e:  # rejected by the engine at admission
            if self.metrics is not None:
                self.metrics.on_request_error()
            raise bad_request(str(e), e.field if isinstance(e, ParamError) else None) from None
        finally:
            self.state.in_flight.discard(request_id)

    async def beam_search(self, request_id: str, prompt: ProcessedPrompt, bp: BeamSearchParams,
                          skip_special_tokens: bool = True) -> list[Hypothesis]:
        """Beam search (engine/beam_search.py): each round, every beam is one engine request, run
        concurrently so they batch, sharing blocks through the prefix cache. -> the hypotheses, best first,
        their text decoded with `skip_special_tokens`. A client that leaves cancels this, which aborts the
        round's requests."""
        bp = dataclasses.replace(bp, max_tokens=min(bp.max_tokens, prompt.max_tokens))
        search = BeamSearch(prompt.prompt_token_ids, bp, self.tokenizer.eog_token_ids)
        params = search.step_params()

        async def candidates(rid: str, seq: list[int]) -> list[tuple[int, float]]:
            final: RequestOutput | None = None
            async with contextlib.aclosing(self.generate(rid, self.process_prompt(seq, params), params)) as outs:
                async for out in outs:
                    if out.finished:
                        self.check_finished(out)
                        final = out
            assert final is not None and final.outputs[0].logprobs
            return [(t.token_id, t.logprob) for t in final.outputs[0].logprobs[0].top]

        rnd = 0
        while not search.done:
            seqs = search.pending()
            search.advance(list(await asyncio.gather(*(candidates(f"{request_id}-r{rnd}b{i}", seq)
                                                         for i, seq in enumerate(seqs)))))
            rnd += 1
        hyps = search.results()
        for h in hyps:
            h.text = self.tokenizer.decode(h.token_ids, skip_special_tokens=skip_special_tokens)
        return hyps

    def check_finished(self, out: RequestOutput) -> None:
        """Turn an aborted or failed final output into the APIError the client should see."""
        reasons = {c.finish_reason for c in out.outputs}
        if out.error_from_input:  # the request's constraint cannot be met by this vocabulary
            raise bad_request(out.error or "the request's input cannot be met", "structured_outputs")
        if FinishReason.ERROR in reasons or out.error and FinishReason.ABORT not in reasons:
            raise APIError(500, f"the request failed: {out.error or 'error inside the engine'}")
        if FinishReason.ABORT in reasons:
            if self.state.is_draining:
                raise APIError(503, "the request was aborted because the server is shutting down")
            raise APIError(500, f"the request was aborted{': ' + out.error if out.error else ''}")

    async def until_disconnect(self, work: Awaitable[T], raw_request: Request) -> T | None:
        """Await `work` unless the client goes away first; then cancel it (aborting its engine requests)
        and return None. For non-streaming responses: streaming ones are watched by Starlette itself."""
        task = asyncio.ensure_future(work)
        watch = asyncio.create_task(_wait_for_disconnect(raw_request))
        try:
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
            watch.cancel()
        if task.cancelled() or not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
        return task.result()

    # -- output helpers --------------------------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        """The text of one token, special tokens included, for logprobs."""
        return self.tokenizer.token_text(token_id)

    def token_bytes(self, token_id: int) -> list[int]:
        """The bytes of one token as OpenAI's logprobs `bytes` (a piece of a character keeps its own bytes,
        where its text is U+FFFD)."""
        return list(self.tokenizer.token_bytes(token_id))

    def prompt_logprobs(self, entries: list[TokenLogprobs | None] | None, n_top: int | None) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs field from the engine's entries (None unless the request asked)."""
        if entries is None or n_top is None:
            return None
        out: PromptLogprobs = []
        for e in entries:
            if e is None:
                out.append(None)
                continue
            d = {str(t.token_id): PromptLogprob(logprob=self.clamp_logprob(t.logprob), rank=t.rank,
                                                decoded_token=self.token_text(t.token_id)) for t in e.top[:n_top]}
            d.setdefault(str(e.token_id), PromptLogprob(logprob=self.clamp_logprob(e.logprob), rank=e.rank,
                                                        decoded_token=self.token_text(e.token_id)))
            out.append(d)
        return out

    @staticmethod
    def clamp_logprob(value: float) -> float:
        return max(float(value), _MIN_LOGPROB)

    @staticmethod
    def usage(num_prompt: int, num_completion: int, num_cached: int | None = None) -> Usage:
        """Token counts; also each chunk's counts so far, with stream_options.continuous_usage_stats.
        `num_cached`: the prompt tokens the prefix cache held, reported as prompt_tokens_details (chat)."""
        details = PromptTokensDetails(cached_tokens=num_cached) if num_cached is not None else None
        return Usage(prompt_tokens=num_prompt, completion_tokens=num_completion,
                     total_tokens=num_prompt + num_completion, prompt_tokens_details=details)


def model_not_found(requested: str, served: list[str]) -> APIError:
    """vLLM's 404 for a model the server does not serve, naming those it does."""
    names = ", ".join(f"`{n}`" for n in served)
    return APIError(404, f"The model `{requested}` does not exist. This server serves {names}.", "model")


def sse(payload: Any) -> bytes:
    """One Server-Sent Events frame: `data: <json>` and a blank line."""
    data = payload.model_dump_json() if hasattr(payload, "model_dump_json") else json.dumps(payload)
    return b"data: " + data.encode() + b"\n\n"


def sse_error(err: APIError) -> bytes:
    return sse(error_body(err.status, err.message, err.param))


async def _wait_for_disconnect(raw_request: Request) -> None:
    """Return when the client has closed the connection (the body has been read already)."""
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Interleave several async iterators as (index, item). Closing the merge cancels every stream."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, end))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
