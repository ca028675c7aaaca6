"""Beam search as a state machine over next-token candidates (torch-free); drivers run it on an engine.

Each round, every running beam becomes one engine request: its tokens as the prompt, max_tokens 1,
greedy, with the top candidates' logprobs. The engine batches the beams together, and its prefix cache
shares their common blocks (a beam forks by being a prompt that starts with its parent's tokens), so a
round computes only each beam's unshared tail. This is how vLLM runs beam search, too.

The selection rules are transformers' (`generate(num_beams=W)`), so results can be held to it:
  - each round, candidates are every (beam, token) with score = beam's cumulative logprob + token's;
    those that end a beam (an end-of-generation token, unless ignore_eos, or the max_tokens-th token)
    and rank among the top W finish, with score / generated_length ** length_penalty;
  - the top W candidates that do not end continue as the beams;
  - the W best finished hypotheses are kept; the search stops when the running beams cannot beat the
    worst of them (early_stopping False: judged at the current length; "never": at the longest length
    when length_penalty > 0), as soon as W have finished (early_stopping True), or at max_tokens.
Per beam, the top W + (number of end tokens) candidates are enough to decide both lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tokenmill.sampling_params import MAX_LOGPROBS, MAX_N, ParamError, SamplingParams

_NEG = -1.0e9


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.beam_width <= MAX_N:
            raise ParamError("n", f"beam search width (n) must be between 1 and {MAX_N}, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ParamError("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.early_stopping not in (True, False, "never"):
            raise ParamError("early_stopping", f"must be true, false or \"never\", got {self.early_stopping!r}")


@dataclass
class Hypothesis:
    token_ids: list[int]  # generated tokens (an end token included when it ended the beam)
    cum_logprob: float
    score: float  # cum_logprob / len(token_ids) ** length_penalty
    finished_by_eos: bool
    text: str = ""  # filled by the driver (the end token, if any, is not text)


@dataclass
class BeamSearch:
    """One prompt's beam search. Loop: `pending()` -> candidates for each -> `advance()`, until `done`."""

    prompt_token_ids: list[int]
    params: BeamSearchParams
    eos_token_ids: frozenset[int]
    beams: list[tuple[list[int], float]] = field(init=False)  # running: (generated tokens, cumulative logprob)
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most beam_width
    done: bool = False
    _improvable: bool = True

    def __post_init__(self) -> None:
        self.beams = [([], 0.0)]  # one beam to start with (the others would only repeat it)
        if self.num_candidates > MAX_LOGPROBS:
            raise ParamError("n", f"beam search width (n) {self.params.beam_width} needs {self.num_candidates} "
                                  f"candidates per beam with this model's {len(self.eos_token_ids)} end tokens; "
                                  f"at most {MAX_LOGPROBS} are available: use a smaller n or ignore_eos")

    @property
    def num_candidates(self) -> int:
        """Top tokens needed per beam each round."""
        ends = 0 if self.params.ignore_eos else len(self.eos_token_ids)
        return self.params.beam_width + ends

    def pending(self) -> list[list[int]]:
        """The token sequences (prompt + beam) whose next-token candidates the next round needs."""
        return [] if self.done else [self.prompt_token_ids + toks for toks, _ in self.beams]

    def advance(self, candidates: list[list[tuple[int, float]]]) -> None:
        """candidates[i]: (token id, logprob) of pending()[i]'s most likely next tokens, at least
        `num_candidates` of them (fewer only if the vocabulary is smaller)."""
        p, W = self.params, self.params.beam_width
        length = len(self.beams[0][0]) + 1  # generated length once this round's token is on
        pool = sorted(((cum + lp, toks + [tok], tok) for (toks, cum), cands in zip(self.beams, candidates)
                       for tok, lp in cands), key=lambda c: -c[0])
        last_round = length >= p.max_tokens

        def ends(tok: int) -> bool:
            return last_round or (not p.ignore_eos and tok in self.eos_token_ids)

        # finished: candidates among the top W that end, unless the search can no longer take any
        full = len(self.finished) >= W
        if self._improvable and not (full and p.early_stopping is True):
            for score, toks, tok in pool[:W]:
                if ends(tok):
                    self.finished.append(Hypothesis(toks, score, score / length ** p.length_penalty,
                                                    not last_round or tok in self.eos_token_ids))
            self.finished.sort(key=lambda h: -h.score)
            del self.finished[W:]
        self.beams = [(toks, score) for score, toks, tok in pool if not ends(tok)][:W]
        if not self.beams:
            self.done = True
            return
        # can the best running beam still beat the worst kept hypothesis?
        if len(self.finished) >= W:
            hyp_len = p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0 else length
            best_running = self.beams[0][1] / hyp_len ** p.length_penalty
            self._improvable = self._improvable and best_running > self.finished[-1].score
        self.done = not self._improvable or (len(self.finished) >= W and p.early_stopping is True)

    def step_params(self) -> SamplingParams:
        """What each beam's engine request asks: one greedy token and the candidates' raw logprobs."""
        return SamplingParams(temperature=0.0, max_tokens=1, logprobs=min(self.num_candidates, MAX_LOGPROBS),
                              ignore_eos=True)

    def results(self) -> list[Hypothesis]:
        """The hypotheses, best first (finished ones; running beams only if the search was cut short)."""
        if self.finished or not self.beams:
            return list(self.finished)
        return [Hypothesis(toks, cum, cum / max(1, len(toks)) ** self.params.length_penalty, False)
                for toks, cum in self.beams]
