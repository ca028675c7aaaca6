"""Pydantic models of Ollama's native API: requests, responses, stream objects, the error body.

Field names are Ollama's (its API docs and its Python client's types). Requests are strict like the OpenAI
ones: no type coercion (`"stream": "yes"` is a 400; an integer is fine where a number is expected) and an
unknown field, top-level or in `options`, is a 400 naming it. Fields this server cannot honour (images,
thinking, image generation) are declared, so a client hears why they are
refused rather than "unknown field"; the serving layer answers 400 unless they carry their neutral value.
`tools` are OpenAI's tool objects (Ollama sends the same shape); the serving layer checks them as the chat
endpoint does.

Answers leave out the fields that do not apply (`exclude_none`), as Ollama does: a stream's objects carry
`done: false` and their text; the last one carries `done: true`, `done_reason` and the counts and
durations (nanoseconds).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OllamaErrorResponse(_Response):
    """Ollama's error body."""

    error: str


# -- options -----------------------------------------------------------------------------------------------
class Options(_Request):
    """Ollama's `options`: sampling (mapped to SamplingParams by options.py) and model placement (fixed at
    start here). Every field Ollama's clients send; anything else is a 400."""

    # sampling and prediction
    num_predict: int | None = None  # -1: until the context ends; -2: fill the context
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None  # negative: a random seed
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None  # the window repeat_penalty looks back over; -1: the whole context
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: int | None = None  # at most the server's context
    num_keep: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    # placement: how the model is loaded, decided once when the server starts
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    rope_frequency_base: float | None = None
    rope_frequency_scale: float | None = None


# -- requests ----------------------------------------------------------------------------------------------
class GenerationFields(_Request):
    """What generate and chat share."""

    model: str
    stream: bool | None = None  # None: true (Ollama streams unless told not to)
    format: Literal["", "json"] | dict[str, Any] | None = None  # "json", or a JSON schema the output follows
    options: Options | None = None
    keep_alive: str | float | None = None  # "5m", "1h30m", seconds; 0 unload now, negative never
    # true: the reasoning comes back as `thinking` (needs --reasoning-parser); false: the template's
    # enable_thinking is false; a level (gpt-oss's) is true with the template's reasoning_effort set to it
    think: bool | Literal["high", "medium", "low"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # alternatives per token, with logprobs
    # Ollama's defaults are true; accepted either way, but this server never cuts a prompt (one that does not
    # fit is a 400 that says so) and never shifts the context (output stops at its end: done_reason "length")
    truncate: bool | None = None
    shift: bool | None = None


class GenerateRequest(GenerationFields):
    """POST /api/generate."""

    prompt: str | None = None  # None or "": load the model and answer done_reason "load"
    suffix: str | None = None  # text after the completion (fill-in-middle)
    system: str | None = None
    template: str | None = None  # a Go template overriding the model's (go_template.py's subset)
    context: list[int] | None = None  # a previous answer's `context`: continue from it
    raw: bool | None = None  # the prompt goes to the model as it is, no template
    images: list[str] | None = None
    width: int | None = None  # image generation: not supported
    height: int | None = None
    steps: int | None = None


class OllamaToolCallFunction(_Request):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class OllamaToolCall(_Request):
    function: OllamaToolCallFunction
    id: str | None = None
    type: Literal["function"] | None = None


class Message(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None  # None: ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None  # assistant turns in the history
    tool_name: str | None = None  # tool messages: which tool answered
    tool_call_id: str | None = None  # tool messages: the call answered (OpenAI-style clients of Ollama send it)
    thinking: str | None = None


class ChatRequest(GenerationFields):
    """POST /api/chat."""

    messages: list[Message] | None = None  # None or []: load the model and answer done_reason "load"
    tools: list[dict[str, Any]] | None = None


class ShowRequest(_Request):
    """POST /api/show (`name` is the older spelling of `model`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None  # also the tokenizer's long arrays in model_info


class PullRequest(_Request):
    """POST /api/pull (`name` is the older spelling of `model`)."""

    model: str | None = None
    name: str | None = None
    insecure: bool | None = None
    stream: bool | None = None  # default: a stream of progress lines


# -- answers -----------------------------------------------------------------------------------------------
class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] | None = None


class _Final(_Response):
    """The fields of a last stream object (or a whole answer): why it ended, counts and nanoseconds."""

    model: str
    created_at: str  # RFC 3339, UTC
    done: bool
    done_reason: str | None = None  # "stop", "length", "load"
    total_duration: int | None = None  # from arrival to the last token
    load_duration: int | None = None  # 0: the model is loaded when the server starts
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None  # from first scheduled to the first token
    eval_count: int | None = None
    eval_duration: int | None = None  # from the first token to the last
    logprobs: list[TokenLogprob] | None = None


class GenerateResponse(_Final):
    response: str
    thinking: str | None = None  # with think: true, the reasoning before the response
    context: list[int] | None = None  # prompt and answer token ids: send back as `context` to continue


class ToolCallFunctionAnswer(_Response):
    index: int  # the call's place in the answer
    name: str
    arguments: dict[str, Any]  # an object, not JSON text (Ollama's shape, unlike OpenAI's)


class ToolCallAnswer(_Response):
    function: ToolCallFunctionAnswer


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str
    thinking: str | None = None  # with think: true, the reasoning before the content
    tool_calls: list[ToolCallAnswer] | None = None  # the calls the model made (the done object of a stream)


class ChatResponse(_Final):
    message: AssistantMessage


class ModelDetails(_Response):
    parent_model: str = ""
    format: str  # "gguf" or "safetensors"
    family: str
    families: list[str]
    parameter_size: str  # e.g. "134.5M"
    quantization_level: str  # e.g. "Q4_1", "F32"


class ListedModel(_Response):
    name: str
    model: str
    modified_at: str
    size: int  # bytes on disk
    digest: str
    details: ModelDetails


class TagsResponse(_Response):
    models: list[ListedModel]


class RunningModel(_Response):
    name: str
    model: str
    size: int  # bytes in memory: weights and KV cache
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int


class PsResponse(_Response):
    models: list[RunningModel]


class ShowResponse(_Response):
    license: str
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class OllamaVersionResponse(_Response):
    version: str


class PullResponse(_Response):
    status: str
