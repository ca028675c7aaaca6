"""StopChecker: the one place that decides whether a sequence is done, after each token it gets.

The rules, in order, for the token just appended:
  1. end of generation (EOS / end-of-turn, unless ignore_eos) or one of stop_token_ids, once min_tokens
     are out: FINISHED_STOPPED, and the token is not part of the text;
  2. a grammar (structured output) that has matched a whole output and allows nothing more:
     FINISHED_STOPPED, the token kept in the text (it is the output's last character); a grammar that
     refused the token (only when every token was masked, e.g. min_tokens banning the end it needed):
     FINISHED_ERROR;
  3. max_tokens reached, or the context is full: FINISHED_LENGTH;
  4. a stop string completed in the text (it may span tokens; searched from just before the new text):
     FINISHED_STOPPED, the text cut at it. This takes precedence over 2 and 3 (the stop string is the reason
     given), and it is only looked for once min_tokens are out.
The engine applies the status it returns once, through Scheduler.finish; nobody rewrites it afterwards.
"""

from __future__ import annotations

from tokenmill.engine.output_processor import SequenceState
from tokenmill.engine.request import Request, RequestStatus


def token_stop(req: Request, max_model_len: int) -> tuple[RequestStatus | None, int | None]:
    """Rules 1 to 3 for the last token of req: (status or None, the stop token id for rule 1). The engine
    has already advanced req.grammar by that token."""
    params = req.sampling_params
    last = req.token_ids[-1]
    if req.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and last in req.eog_token_ids:
            return RequestStatus.FINISHED_STOPPED, None
        if params.stop_token_ids and last in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED, last
    if req.grammar is not None:
        if req.grammar.is_error():
            return RequestStatus.FINISHED_ERROR, None
        if req.grammar.is_stopped():
            return RequestStatus.FINISHED_STOPPED, None
    if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH, None
    return None, None


def find_stop_string(text: str, from_pos: int, stop_strings: list[str]) -> tuple[int, str] | None:
    """The earliest stop string in text[from_pos:] (a start position, the string), or None."""
    best: tuple[int, str] | None = None
    for s in stop_strings:
        j = text.find(s, from_pos)
        if j != -1 and (best is None or j < best[0]):
            best = (j, s)
    return best


class StopChecker:
    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    def check(self, req: Request, seq: SequenceState) -> RequestStatus | None:
        """Account req's last token in its text (seq) and decide. Sets req.stop_reason."""
        params = req.sampling_params
        status, stop_token = token_stop(req, self.max_model_len)
        req.stop_reason = stop_token
        # an EOS or stop token is not text; the token that completes a grammar is
        hidden = status is RequestStatus.FINISHED_STOPPED and (
            stop_token is not None or (not params.ignore_eos and req.token_ids[-1] in req.eog_token_ids))
        before = len(seq.text)
        delta = seq.append_text(req.token_ids[-1], hidden=hidden, flush=status is not None)
        if delta and params.stop_strings and req.num_output_tokens >= params.min_tokens:
            from_pos = max(0, before - max(len(x) for x in params.stop_strings) + 1)
            hit = find_stop_string(seq.text, from_pos, params.stop_strings)
            if hit is not None:
                j, s = hit
                seq.text = seq.text[: j + len(s)] if params.include_stop_str_in_output else seq.text[:j]
                req.stop_reason = s
                status = RequestStatus.FINISHED_STOPPED
        return status
