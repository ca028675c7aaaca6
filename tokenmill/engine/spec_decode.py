"""SpecDecoder: draft tokens for the next step, the rule that keeps speculation where it pays, and the
acceptance counters (torch-free).

After each step the engine calls `propose(running)`: every request that will decode next step may get up
to k drafts (engine/ngram_proposer.py), cut so that they never pass max_tokens or the context, and, under
a grammar, to the prefix the grammar accepts. With a model-based method (draft_model, layer_skip) the
drafts are k DRAFT_PLACEHOLDERs instead, cut the same way: the workers draft them at the start of the
step that verifies them (worker/drafter.py). Those drafts are not known here before the step, so a
request under a grammar (whose mask rows need them) does not speculate with those methods. The scheduler sends them; the runner verifies them (its
sampled token at each draft position either equals the draft, which is kept, or replaces it, ending the
run); the engine then calls `record` with how many were accepted.

The rule (measured on this project's 2-core CPU, README "Speculative decoding"): no drafts while more than
`max_batch_size` requests run (a bigger batch is compute-bound and the extra positions cost as much as
they save); a request whose acceptance rate (an exponential average over its drafts) falls below
`min_acceptance_rate` drafts nothing for `backoff_steps` steps, then tries again with one probe: its
average restarts just above the threshold, so one more failure pauses it again, each consecutive pause
twice as long (up to 16x), and a probe that is accepted ends the doubling. A drafter that never agrees
(layer_skip on a model not trained to exit early) then costs a few probes per request, not one in nine
steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.config import SpeculativeConfig
from tokenmill.engine.ngram_proposer import NgramIndex, propose
from tokenmill.engine.request import Request
from tokenmill.scheduler_output import DRAFT_PLACEHOLDER

_EMA = 0.3  # weight of the latest draft in a request's acceptance average
_MAX_DOUBLINGS = 4


@dataclass
class _SpecState:
    index: NgramIndex = field(default_factory=NgramIndex)
    acceptance: float = 1.0  # exponential average of accepted / proposed
    num_drafts: int = 0
    backoff: int = 0  # steps left without drafting
    pauses: int = 0  # consecutive pauses (each twice the one before, up to _MAX_DOUBLINGS)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.num_drafts = 0  # verification runs (a request with drafts in a step)
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.num_speculative_tokens  # drafts accepted at position i

    def propose(self, running: list[Request]) -> None:
        cfg = self.config
        if len(running) > cfg.max_batch_size:
            return
        for req in running:
            if req.is_finished or req.num_tokens - req.num_computed_tokens != 1:
                continue  # drafts ride on a decode only
            st = req.spec_state
            if st is None:
                st = req.spec_state = _SpecState()
            if st.backoff:
                st.backoff -= 1
                continue
            # the drafts and the token after them must fit max_tokens and the context
            k = min(cfg.num_speculative_tokens, req.max_tokens - req.num_output_tokens - 1,
                    self.max_model_len - req.num_tokens - 1)
            if k <= 0:
                continue
            if cfg.uses_model:
                if req.grammar is None:
                    req.spec_token_ids = [DRAFT_PLACEHOLDER] * k
                continue
            drafts = propose(st.index.sync(req.token_ids), k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            if drafts and req.grammar is not None:
                drafts = drafts[: req.grammar.validate_tokens(drafts)]
            req.spec_token_ids = drafts

    def record(self, req: Request, num_drafts: int, num_accepted: int) -> None:
        """req's `num_drafts` drafts were verified this step and its first `num_accepted` kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1
        st = req.spec_state
        if st is None:
            return
        st.num_drafts += 1
        st.acceptance = (1 - _EMA) * st.acceptance + _EMA * (num_accepted / num_drafts)
        floor = self.config.min_acceptance_rate
        if st.acceptance < floor:
            st.backoff = self.config.backoff_steps << min(st.pauses, _MAX_DOUBLINGS)
            st.pauses += 1
            # after the pause one probe decides: a probe with nothing accepted falls below the floor again
            st.acceptance = min(1.0, floor / (1 - _EMA) - 1e-9) if floor > 0 else 1.0
        elif st.pauses and num_accepted:
            st.pauses = 0

    def stats(self) -> dict[str, float]:
        s: dict[str, float] = {"spec_decode_num_drafts": self.num_drafts,
                               "spec_decode_num_draft_tokens": self.num_draft_tokens,
                               "spec_decode_num_accepted_tokens": self.num_accepted_tokens}
        for i, n in enumerate(self.accepted_per_pos):
            s[f"spec_decode_num_accepted_tokens_per_pos_{i}"] = n
        return s
