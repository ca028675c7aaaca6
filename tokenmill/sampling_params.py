"""SamplingParams: what a caller may ask of one generation, validated once at the door."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, field
from typing import Any

# Hard limits that keep one request from hurting the server (issue: request limits).
MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_LEN = 512
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 1024


class ParamError(ValueError):
    """A bad input value, with the request field it blames (`None`: no single field).

    `str(error)` is the message a user reads; front ends use `field` (e.g. OpenAI's error `param`) and
    never parse the message.
    """

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class StructuredOutputsParams:
    """A constraint on the output's form (vLLM's `structured_outputs`): exactly one of

        json         a JSON schema (a dict or its JSON text): the output is one JSON value it validates
        json_object  True: any JSON object (OpenAI's `response_format: {"type": "json_object"}`)
        regex        the whole output matches this regular expression (Rust `regex` syntax)
        choice       the output is exactly one of these strings
        grammar      a Lark grammar (llguidance's dialect) or a GBNF / EBNF one (llama.cpp's)

    JSON is written with ", " and ": " between items and no other whitespace, unless `whitespace_pattern`
    (a regex for the whitespace allowed between tokens) or `disable_any_whitespace` ("," and ":") says
    otherwise. Compiled and checked by tokenmill/structured_output (llguidance); a constraint that does not
    compile is a ParamError naming `structured_outputs` before anything runs. When the constraint is met
    and nothing more may follow, the request finishes with finish_reason "stop".
    """

    json: str | dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None
    source: str = "structured_outputs"  # the request field it came from: the one an error names

    def __post_init__(self) -> None:
        kinds = self.kinds()
        if len(kinds) != 1:
            raise ParamError(self.source, "give exactly one of json, json_object, regex, choice and grammar"
                             + (f" (got {', '.join(kinds)})" if kinds else ""))
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ParamError(self.source, "choice must be a non-empty list of strings")
        if self.disable_any_whitespace and self.whitespace_pattern is not None:
            raise ParamError(self.source, "give at most one of disable_any_whitespace and whitespace_pattern")

    def kinds(self) -> list[str]:
        return [k for k in ("json", "json_object", "regex", "choice", "grammar") if getattr(self, k) not in (None, False)]

    @property
    def key(self) -> str:
        """A text that identifies the constraint (compiled grammars are cached by it)."""
        spec = {k: getattr(self, k) for k in ("json", "json_object", "regex", "choice", "grammar",
                                               "disable_any_whitespace", "whitespace_pattern")}
        return _json.dumps(spec, sort_keys=True)


# SamplingParams' numeric fields and their kind (validate checks the type before the range)
_FIELD_KINDS: dict[str, type] = {
    "n": int, "top_k": int, "min_tokens": int, "max_tokens": int, "logprobs": int, "prompt_logprobs": int,
    "truncate_prompt_tokens": int, "seed": int, "penalty_window": int, "temperature": float, "top_p": float,
    "min_p": float, "presence_penalty": float, "frequency_penalty": float, "repetition_penalty": float}
_OPTIONAL = frozenset({"max_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens", "seed",
                       "penalty_window"})


@dataclass
class SamplingParams:
    """Per-request generation settings; the vLLM / OpenAI field names and meanings.

    `temperature == 0` means greedy. `max_tokens=None` lets the output fill the rest of the context.
    `logprobs=N` returns the sampled token's logprob plus the top-N alternatives at each step;
    `prompt_logprobs=N` the same for every prompt token after the first (the model's raw log-softmax,
    before any sampling setting; such a request does not read the prefix cache, see Scheduler).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # llama.cpp's penalty_last_n (Ollama's repeat_last_n): the penalties look back over only the last this
    # many tokens (repetition: of prompt + output; presence / frequency: of the output); None: all of them
    penalty_window: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None  # vLLM's: only these tokens may be sampled
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: str = "left"  # with truncate_prompt_tokens: "left" keeps the last N tokens, "right" the first N
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the output must follow
    # vLLM's: requests share prefix-cache blocks only with requests of the same salt (None: with all unsalted
    # ones), so one tenant cannot time another's cached prompts. vLLM carries it on the prompt; here it
    # travels with the request's settings.
    cache_salt: str | None = None
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.logit_bias and any(isinstance(k, str) for k in self.logit_bias):  # JSON's keys are strings
            try:
                self.logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError:
                raise ParamError("logit_bias", "logit_bias keys must be token ids (ints, or strings of digits)") from None
        if isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop or [])
        if self.top_k == -1:
            self.top_k = 0
        self.validate()

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ParamError naming the field and the reason for any bad value."""

        def bad(name: str, why: str) -> None:
            raise ParamError(name, f"{name} {why}")

        for name, kind in _FIELD_KINDS.items():  # a wrong type is named, not a TypeError from a comparison
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            ok = (isinstance(v, int) and not isinstance(v, bool)) if kind is int else (
                isinstance(v, (int, float)) and not isinstance(v, bool))
            if not ok:
                bad(name, f"must be {'an integer' if kind is int else 'a number'}"
                          f"{' or None' if name in _OPTIONAL else ''}, got {type(v).__name__} {v!r}")

        if not 1 <= self.n <= MAX_N:
            bad("n", f"must be between 1 and {MAX_N}, got {self.n}")
        if not 0.0 <= self.temperature <= 100.0:
            bad("temperature", f"must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            bad("top_k", f"must be -1 (disable) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                bad(name, f"must be in [-2, 2], got {v}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if self.penalty_window is not None and self.penalty_window < 1:
            bad("penalty_window", f"must be at least 1 (or None: every token), got {self.penalty_window}")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            bad("min_tokens", f"must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            bad("logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            bad("prompt_logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            bad("truncate_prompt_tokens", f"must be at least 1, got {self.truncate_prompt_tokens}")
        if self.cache_salt is not None and not self.cache_salt:  # vLLM's wording
            raise ParamError("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
        if self.truncation_side not in ("left", "right"):
            bad("truncation_side", f"must be 'left' or 'right', got {self.truncation_side!r}")
        if len(self.stop_strings) > MAX_STOP_STRINGS:
            bad("stop", f"has {len(self.stop_strings)} strings; at most {MAX_STOP_STRINGS} are allowed")
        for s in self.stop_strings:
            if not s:
                bad("stop", "strings must not be empty")
            if len(s) > MAX_STOP_STRING_LEN:
                bad("stop", f"strings must be at most {MAX_STOP_STRING_LEN} characters")
        if self.logit_bias and len(self.logit_bias) > MAX_LOGIT_BIAS:
            bad("logit_bias", f"has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS} are allowed")
        bias = self.logit_bias or {}
        values = [f"{b} for token {tok}" for tok, b in bias.items() if not -100.0 <= b <= 100.0]
        if values:  # every offender named, not just the first
            bad("logit_bias", f"values must be in [-100, 100], got {', '.join(values)}")
        ids = [str(tok) for tok in bias if tok < 0 or (vocab_size is not None and tok >= vocab_size)]
        if ids:
            bad("logit_bias", f"token ids {', '.join(ids)} are out of range [0, {vocab_size or 'vocab_size'})"
                if len(ids) > 1 else f"token id {ids[0]} is out of range [0, {vocab_size or 'vocab_size'})")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                bad("allowed_token_ids", "must not be empty")
            for tok in self.allowed_token_ids:
                if not isinstance(tok, int) or tok < 0 or (vocab_size is not None and tok >= vocab_size):
                    bad("allowed_token_ids", f"token id {tok!r} is out of range [0, {vocab_size or 'vocab_size'})")
        if self.stop_token_ids and len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            bad("stop_token_ids", f"has {len(self.stop_token_ids)} entries; at most {MAX_STOP_TOKEN_IDS} are allowed")
        for tok in self.stop_token_ids or []:
            if tok < 0 or (vocab_size is not None and tok >= vocab_size):
                bad("stop_token_ids", f"token id {tok} is out of range [0, {vocab_size or 'vocab_size'})")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
