"""Request: one sequence the scheduler moves through the engine (torch-free).

The only progress counter is `num_computed_tokens`: tokens [0, num_computed_tokens) have KV in the cache.
`num_tokens - num_computed_tokens` tokens are still to run; that is the whole prompt for a new request,
a remainder for a chunked prefill, and exactly 1 for a decode. Prefix hits and recompute after
preemption are just different starting values of the same counter.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from tokenmill.outputs import FinishReason
from tokenmill.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, its blocks freed, to recompute
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self.value.startswith("finished")

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never None here
    eog_token_ids: frozenset[int] = frozenset()
    seed: int | None = None  # this sequence's own seed (n > 1 children get derived ones)
    fork_of: Request | None = None  # n > 1: share this sibling's prompt blocks once it has prefilled
    arrival_time: float = field(default_factory=time.monotonic)

    status: RequestStatus = RequestStatus.WAITING
    token_ids: list[int] = field(init=False)  # prompt + output; KV exists for [0, num_computed_tokens)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)  # block table: logical block i -> physical id
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of this request's full blocks
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    stop_reason: str | int | None = None
    # structured output: this sequence's grammar matcher (llguidance.LLMatcher; structured_output/manager.py),
    # advanced by each accepted token; None for an unconstrained request
    grammar: Any = None
    # speculative decoding: draft tokens proposed for the next step (the scheduler sends and clears them),
    # and the proposer's / policy's per-request state (engine/spec_decode.py)
    spec_token_ids: list[int] = field(default_factory=list)
    spec_state: Any = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    # what the workers know of it (the step contract sends deltas past these)
    is_known_to_workers: bool = False
    num_sent_tokens: int = 0  # token_ids[:num_sent_tokens] were sent
    num_sent_blocks: int = 0  # block_ids[:num_sent_blocks] were sent; 0 again after a preemption

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished
