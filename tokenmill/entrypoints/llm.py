"""The offline Python API: `LLM(model=...).generate(prompts, sampling_params)` and `.chat(messages, sampling_params)`.

Tool calling offline is the chat endpoint's: `chat(..., tools=..., tool_choice=...)` renders the tools (or
the fallback prompt) and constrains a forced choice; `parse_tool_calls(text, tools, tool_choice)` reads an
answer as content and calls, as the server does.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import typing
from dataclasses import fields
from typing import Any, Sequence, TypeVar

import pydantic
from tqdm.auto import tqdm

from tokenmill.config import EngineConfig, SpeculativeConfig, parse_size
from tokenmill.engine.beam_search import BeamSearch, BeamSearchParams, Hypothesis
from tokenmill.engine.input_processor import ProcessedPrompt
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.entrypoints.openai.protocol import ChatCompletionTool, ChatMessage, NamedToolChoice, join_text_parts
from tokenmill.entrypoints.openai.tool_calling import ToolCalling
from tokenmill.entrypoints.openai.tool_parsers import ParsedOutput
from tokenmill.entrypoints.openai.tool_prompt import ToolPrompt
from tokenmill.entrypoints.vllm_flags import llm_arguments
from tokenmill.outputs import RequestOutput, TokenLogprobs
from tokenmill.sampling_params import ParamError, SamplingParams

# a ProcessedPrompt: made by llm.engine.input_processor already; a dict: vLLM's TextPrompt {"prompt": text} or
# TokensPrompt {"prompt_token_ids": ids}
Prompt = str | list[int] | ProcessedPrompt | dict[str, Any]


def _unwrap(prompt: Any) -> str | list[int] | ProcessedPrompt:
    """A prompt in one of the forms `generate` takes -> text, token ids or a ProcessedPrompt. vLLM's prompt
    dicts are read by their one key; any other key (multi-modal data, ...) is refused by name, not ignored."""
    if isinstance(prompt, dict):
        keys = set(prompt)
        if keys == {"prompt"} and isinstance(prompt["prompt"], str):
            return prompt["prompt"]
        if keys == {"prompt_token_ids"}:
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                return list(ids)
            raise ParamError("prompt", f"prompt_token_ids must be a list of token ids, got "
                                                 f"{type(ids).__name__}" + (" (text: pass it as {'prompt': ...}, or "
                                                 "render with tokenize=True)" if isinstance(ids, str) else ""))
        raise ParamError("prompt", f"a prompt dict takes exactly one of 'prompt' (text) or 'prompt_token_ids' "
                                   f"(a list of token ids); got the keys {sorted(keys)}")
    if isinstance(prompt, (str, ProcessedPrompt)):
        return prompt
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise ParamError("prompt", f"a prompt is text, a list of token ids, or a dict with 'prompt' or "
                               f"'prompt_token_ids'; got {type(prompt).__name__}"
                               + (" with items that are not token ids" if isinstance(prompt, (list, tuple)) else ""))


class LLM:
    """Load a model once and generate for many prompts at a time, batched continuously.

    `LLM()` serves the default model (SmolLM2-135M-Instruct); keyword arguments are EngineConfig fields,
    e.g. `LLM("model.gguf", max_model_len=4096, kv_cache_memory="1GiB")`. `tool_call_parser`: the format
    tool calls are read in, as `serve --tool-call-parser` ("auto": detected from the chat template).
    """

    def __init__(self, model: str = "default", progress: bool = True, tool_call_parser: str = "auto",
                 **kwargs: Any) -> None:
        names = {f.name for f in fields(EngineConfig)}
        kwargs = llm_arguments(model, kwargs)
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown LLM argument(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}")
        if "kv_cache_memory" in kwargs:
            kwargs["kv_cache_memory"] = parse_size(kwargs["kv_cache_memory"])
        if isinstance(kwargs.get("speculative_config"), (dict, str)):  # vLLM's LLM takes the dict
            kwargs["speculative_config"] = SpeculativeConfig.parse(kwargs["speculative_config"])
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs), progress=progress)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._tool_call_parser = tool_call_parser
        self._tool_prompt: ToolPrompt | None = None  # made on first use (it probes the template, logs once)
        # one call at a time: the engine is not thread-safe, so a second thread's generate waits for the first
        self._lock = threading.RLock()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool | None = None, lora_request: Any = None) -> list[RequestOutput]:
        """Generate for every prompt (text, token ids, vLLM's {"prompt": ...} or {"prompt_token_ids": ...}, or a
        ProcessedPrompt); outputs come back in input order. vLLM's signature: `generate(prompts,
        sampling_params)`, one SamplingParams for all or one per prompt. A max_tokens past the context ends that
        output at the context's end (finish_reason length), as in vLLM. Calls from several threads run one
        after another.

        Every prompt is checked before any is queued: a bad one raises ParamError and leaves nothing behind."""
        _no_lora(lora_request)
        with self._lock:
            outputs = self._generate(prompts, sampling_params, use_tqdm)
        for out in outputs:  # vLLM's Logprob.decoded_token
            for c in out.outputs:
                self._decode_logprobs(c.logprobs)
            self._decode_logprobs(out.prompt_logprobs)
        return outputs

    def _decode_logprobs(self, entries: Sequence[TokenLogprobs | None] | None) -> None:
        for e in entries or []:
            if e is None:
                continue
            e.decoded_token = self.tokenizer.token_text(e.token_id)
            for t in e.top:
                t.decoded_token = self.tokenizer.token_text(t.token_id)

    def _generate(self, prompts: Prompt | Sequence[Prompt],
                  sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                  use_tqdm: bool | None) -> list[RequestOutput]:
        params = sampling_params
        if isinstance(prompts, (str, dict, ProcessedPrompt)) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = [_unwrap(p) for p in prompts]  # type: ignore[union-attr]
        if params is None:
            params = self.get_default_sampling_params()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} SamplingParams")
        processor = self.engine.input_processor
        # all of them checked before any runs: a bad prompt leaves nothing queued
        # vLLM's LLM: a max_tokens past the context ends the output there (finish_reason length), not an error
        processed = [processor.process(prompt, p, cap_max_tokens=True)  # type: ignore[arg-type]
                     for prompt, p in zip(prompts, plist)]
        for sp in plist:
            spec = sp.structured_outputs  # type: ignore[union-attr]
            if spec is not None:
                self.engine.structured.compile(spec)  # a grammar that does not compile raises now
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, processed, plist):
            self.engine.add_request(rid, prompt, p)  # type: ignore[arg-type]
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", unit="req", disable=not (use_tqdm if use_tqdm is not None
                                                                                 else len(ids) >= 8))
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        except BaseException:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [done[r] for r in ids]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool | None = None,
             *, add_generation_prompt: bool | None = None, continue_final_message: bool = False,
             chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None, tool_choice: str | dict[str, Any] | None = None,
             parallel_tool_calls: bool | None = None, lora_request: Any = None) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation (one, or a list of them), then generate:
        vLLM's `LLM.chat(messages, sampling_params)`.

        `continue_final_message` leaves the final (assistant) message open for the model to continue (then
        `add_generation_prompt`, otherwise true, defaults to false; both true is a ParamError, as on the server);
        `chat_template` replaces the model's template (Jinja, rendered in the same sandbox);
        `chat_template_kwargs` are further template variables (e.g. {"enable_thinking": False} for Qwen3).
        `tools` (OpenAI tool objects), `tool_choice` ("none", "auto" (the default with tools), "required" or
        {"type": "function", "function": {"name": ...}}) and `parallel_tool_calls` mean what they mean on
        /v1/chat/completions: a forced choice puts its JSON schema on every SamplingParams. Read the answers
        with `parse_tool_calls`. Messages are OpenAI's (assistant `tool_calls`, `tool` results); content is
        text or a list of text parts."""
        _no_lora(lora_request)
        if continue_final_message and add_generation_prompt:
            raise ParamError("continue_final_message",
                             "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        add_generation_prompt = not continue_final_message if add_generation_prompt is None else add_generation_prompt
        params = sampling_params
        conversations = messages
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        calling = self.tool_calling(tools, tool_choice, parallel_tool_calls)
        if calling is not None:
            params = params if params is not None else self.get_default_sampling_params()
            params = (self._with_tools(params, calling) if isinstance(params, SamplingParams)
                      else [self._with_tools(p, calling) for p in params])
        processor = self.engine.input_processor
        prompts: list[Prompt] = []
        for c in conversations:
            checked = _check_messages(c)  # type: ignore[arg-type]
            messages, offered = self._tools().prepare(checked, calling)
            prompts.append(processor.render_chat_ids(messages, add_generation_prompt, offered,
                                                     continue_final_message=continue_final_message,
                                                     template_kwargs=chat_template_kwargs, template=chat_template))
        return self.generate(prompts, params, use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without sampling_params (vLLM's name): SamplingParams' defaults, with
        the model's own recommendations over them (--generation-config; sampling_defaults.py), max_tokens
        from the model's max_new_tokens if it gives one."""
        d, base = self.engine.sampling_defaults, SamplingParams()
        return dataclasses.replace(base, **d.given()) if d.given() else base

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (tokenmill's: encode, decode, apply_chat_template), as vLLM's LLM has it."""
        return self.tokenizer

    def tool_calling(self, tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None = None,
                     parallel_tool_calls: bool | None = None) -> ToolCalling | None:
        """The tools and choice checked as the chat endpoint checks them (None without tools); a bad one
        raises ParamError naming it."""
        checked = [_validated(ChatCompletionTool, t, f"tools[{i}]") for i, t in enumerate(tools)] if tools else None
        choice: str | NamedToolChoice | None
        if isinstance(tool_choice, dict):
            choice = _validated(NamedToolChoice, tool_choice, "tool_choice")
        elif tool_choice in (None, "none", "auto", "required"):
            choice = tool_choice
        else:
            raise ParamError("tool_choice", f"tool_choice must be none, auto, required or a named function, got "
                                            f"{tool_choice!r}")
        return ToolCalling.of(checked, choice, parallel_tool_calls, self._tools().format)

    def parse_tool_calls(self, text: str, tools: list[dict[str, Any]] | None,
                         tool_choice: str | dict[str, Any] | None = None,
                         parallel_tool_calls: bool | None = None) -> ParsedOutput:
        """An answer of `chat(..., tools, tool_choice)` as content and calls (name, arguments JSON text)."""
        calling = self.tool_calling(tools, tool_choice, parallel_tool_calls)
        return calling.parse(text) if calling is not None else ParsedOutput(text)

    def _tools(self) -> ToolPrompt:
        if self._tool_prompt is None:
            self._tool_prompt = ToolPrompt(self.tokenizer, self._tool_call_parser)
        return self._tool_prompt

    @staticmethod
    def _with_tools(params: SamplingParams, calling: ToolCalling) -> SamplingParams:
        """`params` with a forced choice's constraint; "auto" keeps special tokens where the format needs."""
        changes: dict[str, Any] = {}
        constraint = calling.constraint()
        if constraint is not None:
            if params.structured_outputs is not None:
                raise ParamError("tool_choice", f"tool_choice {calling.mode!r} constrains the output to tool calls, "
                                                "so it cannot be combined with structured_outputs")
            changes["structured_outputs"] = constraint
        if calling.mode == "auto" and not calling.format.skip_special_tokens:
            changes["skip_special_tokens"] = False
        return dataclasses.replace(params, **changes) if changes else params

    def beam_search(self, prompts: str | list[int] | Sequence[str | list[int]],
                    params: BeamSearchParams) -> list[list[Hypothesis]]:
        """Beam search for each prompt (engine/beam_search.py: transformers' rules); per prompt, the
        `beam_width` best hypotheses, best first. All prompts' beams run batched, round by round."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        processor = self.engine.input_processor
        searches: list[BeamSearch] = []
        for prompt in prompts:  # type: ignore[union-attr]
            ids = processor.tokenize_prompt(prompt)  # type: ignore[arg-type]
            room = self.engine.max_model_len - len(ids)
            if room < 1:
                processor.process(ids, SamplingParams(max_tokens=1))  # raises the input path's own error
            bp = BeamSearchParams(params.beam_width, min(params.max_tokens, room), params.length_penalty,
                                  params.early_stopping, params.ignore_eos)
            searches.append(BeamSearch(ids, bp, self.tokenizer.eog_token_ids))
        while not all(s.done for s in searches):
            live = [s for s in searches if not s.done]
            seqs = [(s, seq) for s in live for seq in s.pending()]
            outs = self.generate([seq for _, seq in seqs], [s.step_params() for s, _ in seqs], use_tqdm=False)
            i = 0
            for s in live:
                n = len(s.beams)
                s.advance([[(t.token_id, t.logprob) for t in o.outputs[0].logprobs[0].top]  # type: ignore[index]
                           for o in outs[i : i + n]])
                i += n
        results = [s.results() for s in searches]
        for hyps in results:
            for h in hyps:
                h.text = self.tokenizer.decode(h.token_ids)
        return results


M = TypeVar("M", bound=pydantic.BaseModel)


def _validated(model: type[M], value: Any, field: str) -> M:
    """`value` as the request model the chat endpoint would build; a ParamError on `field` otherwise."""
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in (field, *err["loc"]))
        raise ParamError(field, f"{where}: {err['msg']}") from None


_ROLES = typing.get_args(ChatMessage.model_fields["role"].annotation)  # the server's ChatMessage roles


def _check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks the server's chat makes of each message (protocol.ChatMessage), as ParamErrors naming
    messages[i]: a dict with a known role, and content for every role but an assistant's (which may carry
    tool calls instead). -> the messages, an assistant's missing content as "" (as the server renders it)."""
    if not messages:
        raise ParamError("messages", "messages must not be empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ParamError(f"messages[{i}]", f"messages[{i}] must be a dict with 'role' and 'content', got "
                                              f"{type(m).__name__}")
        if m.get("role") not in _ROLES:
            raise ParamError(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(_ROLES)}, got "
                                                   f"{m.get('role')!r}")
        if m.get("content") is None and m["role"] != "assistant":
            raise ParamError(f"messages[{i}].content", f"messages[{i}].content is missing (a {m['role']} message "
                                                      "needs it)")
    return [{**m, "content": _text(m.get("content"), i)} for i, m in enumerate(messages)]


def _text(content: Any, i: int) -> Any:
    """A message's content for the template: None as "", OpenAI's list of text parts joined as the server joins
    them (other parts are refused by name)."""
    if content is None:
        return ""
    return join_text_parts(content, f"messages[{i}].content") if isinstance(content, list) else content


def _no_lora(lora_request: Any) -> None:
    if lora_request is not None:
        raise ParamError("lora_request", "LoRA adapters are not supported (serve a model with the adapter merged)")
