"""Pydantic models of the OpenAI-compatible API: requests, responses, stream chunks and errors.

Field names follow OpenAI's API, plus the sampling fields vLLM accepts beyond it (`top_k`, `min_p`, ...).
Requests forbid unknown fields (a typo or an unsupported feature is a 400 naming it, never silence).
Fields that OpenAI or vLLM define but this server cannot honour (suffix, best_of) are declared here
so the schema shows them, and the serving classes answer 400 (naming the field, and why) when they carry
anything but their neutral value.
The error body (ErrorResponse) is the whole server's, defined in server/errors.py and named here too.
Most fields are `X | None`: clients often send explicit nulls, which mean "the default".

Requests are validated strictly, as OpenAI does: no type coercion (`"stream": "yes"`, `"n": "2"` or
`"max_tokens": 1.0` are 400s), except that an integer is accepted where a number is expected
(`"temperature": 1`). A system, developer, user or tool message must carry `content`; an assistant turn in
the history may leave it null.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from tokenmill.entrypoints.server.errors import ErrorInfo, ErrorResponse  # the server's error shape: re-exported
from tokenmill.sampling_params import ParamError

# torch generators take seeds in [-2**63, 2**64); we keep to signed 64-bit.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1


class _Request(BaseModel):
    # strict: no coercion between types (pydantic's strict float still takes an int, as OpenAI does)
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="null", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _omitted_when_none() -> Any:
    """A response field left out of the JSON when None (OpenAI omits `tool_calls` when there are none)."""
    return Field(default=None, exclude_if=lambda value: value is None)


# -- shared request parts ----------------------------------------------------------------------------------
class StreamOptions(_Request):
    include_usage: bool | None = False
    # vLLM's: with include_usage, every chunk also carries the usage of its choice so far
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(_Request):
    """response_format's json_schema: the schema the answer must validate (always enforced, strict or not)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's response_format: plain text, any JSON object, or JSON that validates a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(_Request):
    """vLLM's structured_outputs: exactly one of json (a schema), json_object, regex, choice, grammar."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool | None = None
    whitespace_pattern: str | None = None


class SamplingFields(_Request):
    """Fields both generation endpoints share (OpenAI's, then vLLM's extras)."""

    model: str | None = None  # None: the served model
    n: int | None = 1
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    top_p: float | None = Field(default=None, allow_inf_nan=False)
    stop: str | list[str] | None = None
    max_tokens: int | None = None  # None: completions 16 (OpenAI's default), chat the rest of the context
    presence_penalty: float | None = Field(default=None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    seed: int | None = Field(default=None, ge=_SEED_MIN, le=_SEED_MAX)
    user: str | None = None  # an end-user id for the caller's own tracking; accepted, not used
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None  # -1 or 0: disabled
    min_p: float | None = Field(default=None, allow_inf_nan=False)
    repetition_penalty: float | None = Field(default=None, allow_inf_nan=False)
    min_tokens: int | None = None
    ignore_eos: bool | None = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    truncate_prompt_tokens: int | None = None  # keep only N prompt tokens: the last N, or see truncation_side
    truncation_side: Literal["left", "right"] | None = None  # None: left (cut the start, keep the last N)
    prompt_logprobs: int | None = None  # logprobs of the prompt's tokens, top N each (not with stream)
    return_token_ids: bool | None = False  # prompt_token_ids and each choice's token_ids in the answer
    cache_salt: str | None = None  # prefix-cache blocks are shared only among requests with the same salt
    # vLLM's beam search fields: declared so a client hears why they are refused (no beam search yet),
    # not "unknown field"; use_beam_search false and the neutral values are accepted
    use_beam_search: bool | None = False
    length_penalty: float | None = Field(default=None, allow_inf_nan=False)
    early_stopping: bool | Literal["never"] | None = None
    # structured output: OpenAI's response_format, vLLM's structured_outputs, or vLLM's older guided_*
    # fields (at most one of them); see README "Structured output"
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None  # top-N alternatives per token (0-20)
    suffix: str | None = None  # not supported: 400 when set
    best_of: int | None = None  # only 1 is supported


class TextPart(BaseModel):
    """One part of a message's content. Only `text` parts are supported; others get a 400."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


def join_text_parts(parts: list[Any], where: str) -> str:
    """OpenAI's list of content parts (TextPart models or plain dicts) as the template's text: the text parts
    joined by newlines. Another kind of part, or a text part without its text, is a ParamError naming it
    (`where`: the list's place, e.g. "messages[2].content"); the server and the offline chat both read it."""
    texts = []
    for j, part in enumerate(parts):
        d = part.model_dump() if isinstance(part, BaseModel) else part if isinstance(part, dict) else {}
        kind = d.get("type", type(part).__name__)
        if kind != "text":
            raise ParamError(f"{where}[{j}].type", f"{where}[{j}]: only text content parts are supported, got type "
                                                   f"{kind!r}")
        if not isinstance(d.get("text"), str):
            raise ParamError(f"{where}[{j}].text", f"{where}[{j}]: a text part needs its `text`")
        texts.append(d["text"])
    return "\n".join(texts)


class FunctionCall(_Request):
    name: str
    arguments: str  # the arguments object as JSON text, as the server reported it


class ChatMessageToolCall(_Request):
    """A call an assistant turn in the history made (what a ToolCall in an answer was)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)  # None: assistant only
    name: str | None = None
    tool_call_id: str | None = None  # tool messages: the call this is the result of
    tool_calls: list[ChatMessageToolCall] | None = None  # assistant turns in the history
    # an assistant turn's reasoning, as a reasoning parser returned it (either name): the template gets it
    # as `reasoning_content` (Qwen3's renders it for the turns after the last user message)
    reasoning: str | None = None
    reasoning_content: str | None = None
    # what OpenAI's answers carry (and its client's message.model_dump() sends back): an assistant turn's
    # refusal (its text, where content is null), the deprecated function_call (a call, as a tool call),
    # annotations (url citations: nothing to render); audio (a reference to an audio answer) is a 400 unless null
    refusal: str | None = None
    function_call: FunctionCall | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None

    @field_validator("content")
    @classmethod
    def _content_required(cls, content: str | list[TextPart] | None,
                          info: ValidationInfo) -> str | list[TextPart] | None:
        """Only an assistant turn may come without content (OpenAI answers 400 for the others)."""
        role = info.data.get("role")  # absent when the role itself was invalid: that error is reported
        if content is None and role is not None and role != "assistant":
            raise PydanticCustomError("missing", "a {role} message needs content (a string or a list of text parts)",
                                      {"role": role})
        return content


class FunctionDefinition(_Request):
    name: str  # letters, digits, '_' and '-', at most 64 (OpenAI's rule; checked by ToolCalling)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object; None: no arguments
    strict: bool | None = None  # true: a call whose arguments break the schema is not reported as a call


class ChatCompletionTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    """tool_choice naming one function: the answer is a call of it."""

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # wins over max_tokens when both are given
    logprobs: bool | None = False
    top_logprobs: int | None = None  # needs logprobs=true
    # None: true, unless continue_final_message (the two cannot both be true)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = False  # vLLM's: the model continues the final (assistant) message
    # vLLM's: further variables for the chat template, e.g. {"enable_thinking": false} (Qwen3)
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: with --reasoning-parser, false leaves the reasoning out of the answer (it is still not content)
    include_reasoning: bool | None = True
    echo: bool | None = False  # vLLM's: the answer starts with the final message's content, if it is the assistant's
    tools: list[ChatCompletionTool] | None = None
    # None: "auto" with tools, "none" without; "required": at least one call; a NamedToolChoice: that call
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: true; false: at most one call
    # OpenAI's fields that ask nothing this server does differently: accepted (clients send them by default)
    store: bool | None = None  # OpenAI keeps the completion for retrieval; this server keeps none (no retrieval API)
    metadata: dict[str, str] | None = None  # tags for a stored completion
    service_tier: str | None = None  # every request is served alike
    prompt_cache_key: str | None = None  # a caching hint: the prefix cache matches prompts by their tokens anyway
    safety_identifier: str | None = None  # an end-user id, as `user`
    # a chat template variable (gpt-oss's templates read it); chat_template_kwargs' own entry wins
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    modalities: list[Literal["text"]] | None = None  # text answers only: ["audio"] is a 400
    # declared so a client hears why they are refused, not "unknown field": 400 unless null
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


class ResponsesRequest(_Request):
    """POST /v1/responses (OpenAI's Responses API; serving_responses.py says what each field does here)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream_options: dict[str, Any] | None = None
    # vLLM's sampling extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # refused unless null / false, so a client hears why
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    prompt: dict[str, Any] | None = None


class TokenizeRequest(_Request):
    """POST /tokenize: a prompt, or chat messages rendered with the template first."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatCompletionTool] | None = None  # with messages: rendered as chat renders them ("auto")
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = None  # as in chat: None means true unless continue_final_message
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None  # with messages: as in chat
    return_token_strs: bool | None = False  # vLLM's: also the vocabulary string of each token


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


# -- responses ---------------------------------------------------------------------------------------------
class PromptTokensDetails(_Response):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # OpenAI's, on chat answers: how many prompt tokens the prefix cache held (omitted where not counted)
    prompt_tokens_details: PromptTokensDetails | None = _omitted_when_none()


class CompletionLogprobs(_Response):
    """The completions logprobs shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(_Response):
    """vLLM's prompt_logprobs entry for one token id."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: per prompt token, {token id: entry} holding the token itself and the top N;
# the first is null (nothing comes before it)
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's extra: the stop string or token id that ended it
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's extra, when asked for
    # vLLM's, with return_token_ids: the prompt's ids (streamed: in a choice's first chunk only) and the
    # choice's generated ids (streamed: the ids new in this chunk)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatTopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None = None


class ToolCallFunction(_Response):
    name: str
    arguments: str  # JSON text


class ToolCall(_Response):
    id: str  # chatcmpl-tool-<hex> (Mistral's formats: 9 letters and digits)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatResponseMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None  # None when the answer is only tool calls
    # with --reasoning-parser: the text the model thought before its answer, under both names clients
    # read: vLLM's `reasoning` (since 0.18) and `reasoning_content` (vLLM's before, SGLang's, llama.cpp's)
    reasoning: str | None = _omitted_when_none()
    reasoning_content: str | None = _omitted_when_none()
    tool_calls: list[ToolCall] | None = _omitted_when_none()  # the calls the answer makes, in order


class DeltaFunctionCall(_Response):
    name: str | None = _omitted_when_none()  # in a call's first piece
    arguments: str | None = _omitted_when_none()  # arguments text to append


class DeltaToolCall(_Response):
    """A piece of a streamed call: the first carries id, type and name; arguments pieces join to the whole.
    Absent fields are left out (not null): later pieces carry only what they add, as OpenAI's do."""

    index: int  # the call's position in the answer's tool_calls
    id: str | None = _omitted_when_none()
    type: Literal["function"] | None = _omitted_when_none()
    function: DeltaFunctionCall | None = _omitted_when_none()


class ChatChoice(_Response):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's extra, when asked for
    prompt_token_ids: list[int] | None = None  # with return_token_ids (vLLM puts chat's here, not on the choice)


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = _omitted_when_none()  # with --reasoning-parser, under both names (as the message)
    reasoning_content: str | None = _omitted_when_none()
    tool_calls: list[DeltaToolCall] | None = _omitted_when_none()


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids: the ids new in this chunk


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids: in each choice's first chunk only


class CompletionChunk(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenmill"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(_Response):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # with return_token_strs


class DetokenizeResponse(_Response):
    prompt: str
