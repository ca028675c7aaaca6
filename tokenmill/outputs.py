"""What the engine hands back to callers: plain data, one RequestOutput per request per step."""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass, field


class FinishReason(str, enum.Enum):
    """Why a sequence ended; the values are OpenAI's `finish_reason` strings."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # the caller aborted (client left, timeout, shutdown)
    ERROR = "error"  # the request failed inside the engine

    def __str__(self) -> str:  # print() and f-strings show "length", as vLLM's plain strings do
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class Logprob:
    token_id: int
    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str | None = None  # its text (vLLM's field; the offline API fills it)


@dataclass
class TokenLogprobs:
    """The sampled token's logprob plus the top-N alternatives at one position. Also read as vLLM's position
    entry, a dict token id -> Logprob over the alternatives and the sampled token: `entry[token_id].logprob`,
    `entry.items()`, `token_id in entry`, so vLLM's offline code reads it unchanged."""

    token_id: int
    logprob: float
    rank: int
    top: list[Logprob] = field(default_factory=list)
    decoded_token: str | None = None  # the sampled token's text (the offline API fills it)

    def as_dict(self) -> dict[int, Logprob]:
        """vLLM's shape: the top-N alternatives, and the sampled token (if it is not among them)."""
        out = {t.token_id: t for t in self.top}
        out.setdefault(self.token_id, Logprob(self.token_id, self.logprob, self.rank, self.decoded_token))
        return out

    def __getitem__(self, token_id: int) -> Logprob:
        return self.as_dict()[token_id]

    def __contains__(self, token_id: object) -> bool:
        return token_id in self.as_dict()

    def __len__(self) -> int:
        return len(self.as_dict())

    def __iter__(self) -> typing.Iterator[int]:  # type: ignore[override]  # a dict's iteration: its keys
        return iter(self.as_dict())

    def get(self, token_id: int, default: Logprob | None = None) -> Logprob | None:
        return self.as_dict().get(token_id, default)

    def keys(self) -> list[int]:
        return list(self.as_dict())

    def values(self) -> list[Logprob]:
        return list(self.as_dict().values())

    def items(self) -> list[tuple[int, Logprob]]:
        return list(self.as_dict().items())


@dataclass
class CompletionOutput:
    index: int
    text: str  # the whole text so far
    token_ids: list[int]
    delta_text: str = ""  # text new since the previous output of this sequence
    delta_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """vLLM's: the sum of the sampled tokens' logprobs, when logprobs were asked for (None otherwise)."""
        return None if self.logprobs is None else float(sum(e.logprob for e in self.logprobs))


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    max_tokens: int | None = None  # the request's max_tokens (None: up to the context's end)
    n: int = 1  # the sequences it asked for


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None
    # prompt_logprobs=N: one entry per prompt token, the first None (nothing comes before it to score it);
    # each the model's raw log-softmax of that token given the ones before it, with the top-N alternatives
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # the error comes from the request's own input, not from the engine: a constraint whose text the
    # model's vocabulary cannot write (the grammar refused every token it allowed); the API answers 400
    error_from_input: bool = False

    @property
    def num_cached_tokens(self) -> int:
        """vLLM's: prompt tokens read from the prefix cache."""
        return self.metrics.num_cached_tokens if self.metrics is not None else 0
