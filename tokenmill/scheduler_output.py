"""The step contract between the scheduler and the workers: request ids and token counts, nothing live.

Plain dataclasses, no torch and no `Request` objects, so a multi-process executor can serialise them as
they are (tests/engine/test_step_contract.py sends every step through the standard library's serialiser).
The workers keep their own per-request state (token ids, block table, generator) by id:

    first time a request is scheduled        -> NewRequestData (everything the workers need, once)
    every later step it is scheduled in       -> one row of CachedRequestData (deltas only)
    it finished, was aborted or stopped       -> its id in finished_req_ids (workers drop its state)

`num_scheduled_tokens[req_id]` is the one scheduling quantity: the request computes tokens
[num_computed_tokens, num_computed_tokens + n). A request samples when that range reaches the end of
the tokens it has (a decode, or the last chunk of a prompt); the workers work that out themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenmill.outputs import TokenLogprobs
from tokenmill.sampling_params import SamplingParams


# A draft token the workers choose themselves (a model-based drafter, worker/drafter.py): the engine sends
# k of them for a request, the scheduler reserves their slots, and the workers draft and verify in one step.
DRAFT_PLACEHOLDER = -1


@dataclass
class NewRequestData:
    """Sent once, the first time a request is scheduled."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # empty unless the workers never saw it before (e.g. a restarted worker)
    sampling_params: SamplingParams
    seed: int | None  # this sequence's own seed (n > 1 children get derived ones)
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Deltas for requests the workers already know, one entry per request in each list."""

    req_ids: list[str] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)  # output tokens appended since last sent
    new_block_ids: list[list[int]] = field(default_factory=list)  # blocks appended to the table
    num_computed_tokens: list[int] = field(default_factory=list)
    # True: the request was preempted and re-admitted; `new_block_ids` is its whole table, not a delta
    resumed_from_preemption: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.req_ids)


@dataclass
class StatePlan:
    """A model with recurrent layers: how one request's recurrent state moves this step (engine/state_cache.py).
    Its tokens [num_computed_tokens, ends[-1]) read the state in slot `src` (-1: zeros, it starts at token 0) and
    are computed in segments: segment i ends at position ends[i] (ascending) and writes the state there into slot
    dsts[i], which segment i + 1 reads."""

    src: int
    ends: list[int]
    dsts: list[int]


@dataclass
class SchedulerOutput:
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # in scheduling order
    total_num_scheduled_tokens: int = 0
    # draft tokens to verify (speculative decoding); DRAFT_PLACEHOLDER entries: the workers' drafter fills them
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)  # since the previous step
    preempted_req_ids: list[str] = field(default_factory=list)  # in this step
    # structured output: the requests that sample under a grammar this step -> their row of grammar_bitmask,
    # a (G, ceil(V / 32)) int32 numpy array whose row g allows token t iff bit t % 32 of word t // 32 is set
    structured_output_request_ids: dict[str, int] = field(default_factory=dict)
    grammar_bitmask: Any = None  # numpy.ndarray | None (numpy, not torch: the contract stays torch-free)
    # a model with recurrent layers: every scheduled request's state moves (slots of the workers' state pool)
    state_plans: dict[str, StatePlan] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class PromptLogprobsChunk:
    """Prompt logprobs one prefill chunk produced: `entries[j]` scores prompt token `start + j` (start >= 1)."""

    start: int
    entries: list[TokenLogprobs]


@dataclass
class ModelRunnerOutput:
    """What one step produced, by request id. Only requests that sampled appear."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)  # one token each today
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # one entry per sampled token
    # requests with prompt_logprobs whose prefill chunk ran this step (a recomputed chunk comes again: the
    # engine stores entries by position, so a repeat overwrites with the same numbers)
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
