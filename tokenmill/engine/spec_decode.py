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

The rule (engine/step_cost.py has the measurement it rests on):
- no drafts while more than `max_batch_size` requests run (a big batch is compute-bound on a CPU and the
  extra positions cost as much as they save);
- the draft length (`draft_length` "adaptive", the default): each request keeps an estimate alpha of the
  chance that a draft is accepted once the drafts before it were (decayed counts of accepted drafts and of
  rejections, starting at 0.75), and the engine measures what one more row costs in a decode step
  (StepCost, from its own steps). A request drafts the k <= num_speculative_tokens that gives the most
  tokens per unit of time, (1 + alpha + ... + alpha^k) / (1 + row_cost k); none when no k pays. While
  the steps seen cannot tell rows apart, or no step without drafts was timed lately (a drafter accepted
  every time drafts every step), one step in 8 drafts nothing, so that the cost is measured rather than
  assumed. "fixed": always num_speculative_tokens (vLLM's behaviour);
- a pause: a request for which no draft pays, or whose alpha falls below `min_acceptance_rate`, drafts
  nothing for `backoff_steps` steps, then probes with at least one draft; a failed probe pauses it again,
  each consecutive pause twice as long (up to 16x), and an accepted probe ends the doubling and starts
  its estimate over. A drafter that never agrees (layer_skip on a model not trained to exit early) then
  costs a few probes per request, not one in nine steps;
- the check on what drafting gave (adaptive only): over each window of _GAIN_WINDOW steps with
  drafts, the tokens they produced are valued at what steps without drafts take per token (time(B) / B,
  the mean of the recent steps of B rows), against the time those steps took. Below _MIN_GAIN (the
  estimates above were wrong: an acceptance that comes in bursts, a step that costs more than its rows
  said) nobody drafts for `backoff_steps` steps, each consecutive pause twice as long (up to 16x); a
  window that pays ends the doubling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.config import SpeculativeConfig
from tokenmill.engine.ngram_proposer import NgramIndex, propose
from tokenmill.engine.request import Request
from tokenmill.engine.step_cost import StepCost, best_draft_length
from tokenmill.scheduler_output import DRAFT_PLACEHOLDER

_DECAY = 0.7  # weight of a request's earlier verifications in its estimate, per verification
_PRIOR_ACCEPTED, _PRIOR_REJECTED = 3.0, 1.0  # an estimate of 0.75 before any draft
_MAX_DOUBLINGS = 4
_EXPLORE_EVERY = 8  # while the steps seen cannot tell rows apart, one step in this many drafts nothing
# what one more row costs, as a fraction of a one-row decode step, until the engine has measured it: the
# default model's GGUF path on the 2-core EPYC (benchmarks/README.md, "adaptive draft length")
ROW_COST_PRIOR = 0.25
_GAIN_WINDOW = 16  # steps with drafts per check of what they gave
_MIN_GAIN = 0.95  # below this, the window's drafting lost time: everybody pauses


@dataclass
class _SpecState:
    index: NgramIndex = field(default_factory=NgramIndex)
    accepted: float = _PRIOR_ACCEPTED  # decayed count of accepted drafts
    rejected: float = _PRIOR_REJECTED  # decayed count of verifications that rejected a draft
    num_drafts: int = 0
    backoff: int = 0  # steps left without drafting
    pauses: int = 0  # consecutive pauses (each twice the one before, up to _MAX_DOUBLINGS)
    probe: bool = False  # the next draft follows a pause: it decides whether the request drafts on

    @property
    def acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.cost = StepCost(ROW_COST_PRIOR)
        self._chances = 0  # steps in which drafting was considered
        self.num_drafts = 0  # verification runs (a request with drafts in a step)
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.max_drafts  # drafts accepted at position i
        self._step_accepted = 0  # drafts accepted in the step being recorded
        self._gain_value = self._gain_time = 0.0  # this window: drafting steps' tokens at the plain rate, time
        self._gain_steps = 0
        self.gain = 1.0  # the last window's gain (reported)
        self.num_pauses = 0  # windows that lost time
        self._backoff = 0  # steps left in which nobody drafts
        self._pauses = 0  # consecutive losing windows

    def observe_step(self, rows: int, num_requests: int, seconds: float) -> None:
        """A step in which each of num_requests requests decoded (with its drafts: `rows` in all) took
        `seconds`, the drafts recorded (`record`) before. Only steps where drafting is considered teach
        the cost."""
        accepted, self._step_accepted = self._step_accepted, 0
        if num_requests > self.config.max_batch_size or num_requests <= 0:
            return
        plain = self.cost.time(num_requests) if self.cost.knows(num_requests) else None
        recorded = self.cost.observe(rows, seconds)
        if rows > num_requests and plain is not None and self.config.draft_length == "adaptive":
            self._gain_value += plain * (num_requests + accepted) / num_requests
            self._gain_time += recorded
            self._gain_steps += 1
            if self._gain_steps >= _GAIN_WINDOW:
                self.gain = self._gain_value / self._gain_time
                self._gain_value = self._gain_time = 0.0
                self._gain_steps = 0
                if self.gain < _MIN_GAIN:
                    self._backoff = self.config.backoff_steps << min(self._pauses, _MAX_DOUBLINGS)
                    self._pauses += 1
                    self.num_pauses += 1
                else:
                    self._pauses = 0

    def _pause(self, st: _SpecState) -> None:
        st.backoff = self.config.backoff_steps << min(st.pauses, _MAX_DOUBLINGS)
        st.pauses += 1
        st.probe = True

    def propose(self, running: list[Request]) -> None:
        cfg = self.config
        if len(running) > cfg.max_batch_size:
            return
        if self._backoff:  # the last window's drafting lost time
            self._backoff -= 1
            return
        # drafts ride on a decode only
        decoding = [r for r in running if not r.is_finished and r.num_tokens - r.num_computed_tokens == 1]
        self._chances += 1
        if (cfg.draft_length == "adaptive" and self._chances % _EXPLORE_EVERY == 0 and self.cost.observed
                and (self.cost.line() is None or not self.cost.knows(len(decoding)))):
            return  # every step lately had drafts (say, all accepted): one without them measures the rows
        row_cost = self.cost.row_cost(len(decoding))
        for req in decoding:
            st = req.spec_state
            if st is None:
                st = req.spec_state = _SpecState()
            if st.backoff:
                st.backoff -= 1
                continue
            # the drafts and the token after them must fit max_tokens and the context
            k = min(cfg.max_drafts, req.max_tokens - req.num_output_tokens - 1,
                    self.max_model_len - req.num_tokens - 1)
            if k <= 0:
                continue
            if cfg.draft_length == "adaptive":
                best = best_draft_length(st.acceptance, row_cost, k)
                if best == 0 and not st.probe:
                    self._pause(st)
                    continue
                k = max(1, best)
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
        self._step_accepted += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1
        st = req.spec_state
        if st is None:
            return
        st.num_drafts += 1
        if st.probe:
            st.probe = False
            if num_accepted == 0:  # a failed probe: pause again, twice as long
                self._pause(st)
                return
            st.pauses = 0  # an accepted probe: the doubling ends and the estimate starts over
            st.accepted, st.rejected = _PRIOR_ACCEPTED, _PRIOR_REJECTED
        st.accepted = _DECAY * st.accepted + num_accepted
        st.rejected = _DECAY * st.rejected + (num_accepted < num_drafts)
        if st.acceptance < self.config.min_acceptance_rate:
            self._pause(st)

    def stats(self) -> dict[str, float]:
        s: dict[str, float] = {"spec_decode_num_drafts": self.num_drafts,
                               "spec_decode_num_draft_tokens": self.num_draft_tokens,
                               "spec_decode_num_accepted_tokens": self.num_accepted_tokens}
        for i, n in enumerate(self.accepted_per_pos):
            s[f"spec_decode_num_accepted_tokens_per_pos_{i}"] = n
        return s
