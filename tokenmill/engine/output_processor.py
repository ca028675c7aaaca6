"""OutputProcessor: tokens -> text for each sequence, stop strings, logprobs, and RequestOutputs.

Stop strings are looked for by the engine's StopChecker (the one stop authority), in the text this
builds. While a sequence runs, its last (longest stop string - 1) characters are held back from
the streamed delta: they might be the start of a stop string that must not be shown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tokenmill.engine.request import Request, RequestStatus
from tokenmill.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from tokenmill.tokenizer.detokenizer import IncrementalDetokenizer
from tokenmill.tokenizer.tokenizer import Tokenizer


@dataclass
class SequenceState:
    request: Request
    index: int
    detok: IncrementalDetokenizer
    text: str = ""
    num_sent_chars: int = 0
    num_sent_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None

    def append_text(self, token_id: int, hidden: bool, flush: bool) -> str:
        """Detokenize one new token into `text` (none of it if `hidden`, e.g. an EOS); `flush` at the
        sequence's end releases any held-back partial character. Returns the text added."""
        delta = "" if hidden else self.detok.push([token_id])
        if flush:
            delta += self.detok.flush()
        self.text += delta
        return delta


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[SequenceState]
    stream: bool
    arrival_time: float
    hold_back: int = 0
    finished_emitted: bool = False
    error: str | None = None
    error_from_input: bool = False  # see RequestOutput
    # prompt_logprobs=N: entry i scores prompt token i, filled as prefill chunks run (entry 0 stays None)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], seqs: list[Request],
            stream: bool) -> None:
        params = seqs[0].sampling_params
        st = RequestState(request_id, prompt, prompt_token_ids, [], stream, seqs[0].arrival_time)
        st.metrics.max_tokens, st.metrics.n = params.max_tokens, len(seqs)
        for i, r in enumerate(seqs):
            st.seqs.append(SequenceState(r, i, IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
                                         logprobs=[] if params.logprobs is not None else None))
        st.hold_back = max((len(s) for s in params.stop_strings), default=1) - 1
        if params.prompt_logprobs is not None:
            st.prompt_logprobs = [None] * len(prompt_token_ids)
        self.states[request_id] = st

    def make_output(self, st: RequestState, force: bool = False) -> RequestOutput | None:
        """The RequestOutput for this step, or None if nothing new is to be told."""
        outs: list[CompletionOutput] = []
        changed = force
        for seq in st.seqs:
            req = seq.request
            done = req.is_finished
            emit_to = len(seq.text) if done else max(seq.num_sent_chars, len(seq.text) - st.hold_back)
            out_ids = req.output_token_ids
            delta_text = seq.text[seq.num_sent_chars : emit_to]
            delta_ids = out_ids[seq.num_sent_tokens :]
            if delta_text or delta_ids or (done and not st.finished_emitted):
                changed = True
            outs.append(CompletionOutput(
                index=seq.index, text=seq.text[:emit_to], token_ids=list(out_ids), delta_text=delta_text,
                delta_token_ids=delta_ids, logprobs=seq.logprobs,
                finish_reason=req.status.finish_reason if done else None, stop_reason=req.stop_reason))
            seq.num_sent_chars = emit_to
            seq.num_sent_tokens = len(out_ids)
        finished = all(s.request.is_finished for s in st.seqs)
        if not changed:
            return None
        if finished:
            st.finished_emitted = True
            st.metrics.finished_time = time.monotonic()
            first = st.seqs[0].request
            st.metrics.first_scheduled_time = first.first_scheduled_time
            st.metrics.first_token_time = min((s.request.first_token_time for s in st.seqs
                                               if s.request.first_token_time), default=None)
            st.metrics.num_preemptions = sum(s.request.num_preemptions for s in st.seqs)
            st.metrics.num_cached_tokens = first.num_cached_tokens
        return RequestOutput(st.request_id, st.prompt, st.prompt_token_ids, outs, finished, st.metrics, st.error,
                             st.prompt_logprobs, st.error_from_input)

