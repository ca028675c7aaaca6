"""CachedRequestState: what the runner keeps of each request it was told about, by id.

It is updated only from the step contract (scheduler_output.py): created from NewRequestData, then
advanced by the deltas in CachedRequestData, dropped when the id is in finished_req_ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenmill.sampling_params import SamplingParams


@dataclass(eq=False)
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int | None
    block_ids: list[int]
    num_computed_tokens: int
    token_ids: list[int] = field(default_factory=list)  # prompt + output, as the scheduler sent them
    generator: torch.Generator | None = None  # a seeded request's own, made on first use

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]
