"""The rule that keeps speculation where it pays (engine/spec_decode.py, engine/step_cost.py), torch-free: a
request whose drafts keep failing pauses, each consecutive pause twice as long, and one accepted probe ends
the doubling; the adaptive draft length follows the request's acceptance and the measured cost of a row;
with a model drafter the drafts are placeholders cut like n-gram ones."""

from __future__ import annotations

from tokenmill.config import SpeculativeConfig
from tokenmill.engine.request import Request
from tokenmill.engine.spec_decode import _GAIN_WINDOW, SpecDecoder
from tokenmill.engine.step_cost import StepCost, best_draft_length, expected_tokens
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler_output import DRAFT_PLACEHOLDER


def decoding(max_tokens: int = 1000) -> Request:
    r = Request("r", list(range(10)), SamplingParams(max_tokens=max_tokens), max_tokens, frozenset(), None)
    r.token_ids.append(7)  # one output token, the prompt computed: it decodes next
    r.num_computed_tokens = len(r.token_ids) - 1
    return r


def steps_until_drafting(spec: SpecDecoder, req: Request) -> int:
    n = 0
    while True:
        req.spec_token_ids = []
        spec.propose([req])
        if req.spec_token_ids:
            return n
        n += 1


def test_failing_drafts_pause_longer_each_time_and_one_success_resets() -> None:
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=4, backoff_steps=16, draft_length="fixed",
                            min_acceptance_rate=0.5)
    spec, req = SpecDecoder(cfg, 4096), decoding()
    spec.propose([req])
    assert req.spec_token_ids == [DRAFT_PLACEHOLDER] * 4
    spec.record(req, 4, 0)  # the estimate 0.75 -> 0.55: still above 0.5
    assert steps_until_drafting(spec, req) == 0
    spec.record(req, 4, 0)  # 0.40: pause
    pauses = []
    for _ in range(6):
        pauses.append(steps_until_drafting(spec, req))
        spec.record(req, 4, 0)  # one failed probe pauses again
    assert pauses == [16, 32, 64, 128, 256, 256]
    steps_until_drafting(spec, req)
    spec.record(req, 4, 3)  # an accepted probe: drafting goes on, and the doubling starts over
    assert steps_until_drafting(spec, req) == 0
    spec.record(req, 4, 0)
    spec.record(req, 4, 0)
    assert steps_until_drafting(spec, req) == 16


def test_placeholders_are_cut_to_max_tokens_and_skip_big_batches() -> None:
    cfg = SpeculativeConfig(method="draft_model", model="x.gguf", num_speculative_tokens=4, max_batch_size=2)
    spec = SpecDecoder(cfg, 4096)
    near_end = decoding(max_tokens=3)  # 1 of 3 out: the drafts and the token after them fit in 2
    spec.propose([near_end])
    assert near_end.spec_token_ids == [DRAFT_PLACEHOLDER]
    batch = [decoding() for _ in range(3)]
    spec.propose(batch)
    assert all(r.spec_token_ids == [] for r in batch)  # more than max_batch_size running: no drafts


def test_step_cost_fits_the_line_of_the_steps_it_sees() -> None:
    cost = StepCost(prior=0.25)
    assert cost.row_cost(1) == 0.25  # nothing seen: the prior
    for _ in range(20):
        cost.observe(1, 0.010)
    assert cost.row_cost(1) == 0.25  # one size only: rows cannot be told apart
    for _ in range(10):  # t(R) = 8 ms + 2 ms R
        cost.observe(5, 0.018)
        cost.observe(1, 0.010)
        cost.observe(3, 0.014)
    a, b = cost.line() or (0.0, 0.0)
    assert abs(a - 0.008) < 1e-9 and abs(b - 0.002) < 1e-9
    assert abs(cost.row_cost(1) - 0.2) < 1e-9 and abs(cost.row_cost(2) - 0.002 / 0.012) < 1e-9
    cost.observe(5, 10.0)  # one stall counts as 3x the line's time, not as 10 s
    assert cost.row_cost(1) < 0.5
    for _ in range(200):  # the machine changed: rows now nearly free; older steps fade
        cost.observe(1, 0.010)
        cost.observe(5, 0.0104)
    assert cost.row_cost(1) < 0.02 + 1e-9


def test_best_draft_length_weighs_tokens_against_rows() -> None:
    assert expected_tokens(0.5, 2) == 1.75 and expected_tokens(1.0, 4) == 5.0
    assert best_draft_length(0.2, 0.25, 4) == 0  # a draft is accepted less often than a row costs
    assert best_draft_length(0.95, 0.02, 8) == 8  # rows nearly free: draft all
    assert 1 <= best_draft_length(0.6, 0.25, 8) < best_draft_length(0.9, 0.25, 8)
    assert best_draft_length(0.9, 0.25, 8) < best_draft_length(0.9, 0.05, 8)
    for alpha in (0.3, 0.6, 0.9):  # the choice is the best of all k
        k = best_draft_length(alpha, 0.25, 8)
        rates = [expected_tokens(alpha, j) / (1 + 0.25 * j) for j in range(9)]
        assert rates[k] == max(rates)


def test_step_cost_table_answers_the_sizes_it_has_seen() -> None:
    """Step times that jump at 4 rows and then stay flat: the table answers each size seen twice lately,
    the line the others; sizes not seen for a long while fall back to the line."""
    cost = StepCost(prior=0.25)
    times = {1: 0.010, 2: 0.013, 3: 0.016, 4: 0.016, 5: 0.016}
    assert cost.time(1) is None
    for r, t in times.items():
        cost.observe(r, t)
    assert not cost.knows(1)  # once is not enough
    for _ in range(2):
        for r, t in times.items():
            cost.observe(r, t)
    assert all(abs((cost.time(r) or 0.0) - t) < 1e-12 for r, t in times.items())
    a, b = cost.line() or (0.0, 0.0)
    assert not cost.knows(9) and abs((cost.time(9) or 0.0) - (a + 9 * b)) < 1e-12
    for _ in range(300):  # sizes not seen for a long while are no longer trusted
        cost.observe(1, 0.010)
    assert not cost.knows(5) and cost.knows(1)


def test_adaptive_length_follows_acceptance_and_pauses_when_nothing_pays() -> None:
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=8, backoff_steps=4)
    spec, req = SpecDecoder(cfg, 4096), decoding()
    lengths = []
    for _ in range(6):  # every draft accepted: the length grows to the most allowed
        spec.propose([req])
        lengths.append(len(req.spec_token_ids))
        spec.record(req, lengths[-1], lengths[-1])
    assert lengths[0] < 8 and lengths[-1] == 8 and lengths == sorted(lengths)
    failing = []
    for _ in range(12):  # nothing accepted: the length shrinks, then the request pauses
        req.spec_token_ids = []
        spec.propose([req])
        n = len(req.spec_token_ids)
        if n == 0:
            break
        failing.append(n)
        spec.record(req, n, 0)
    assert failing == sorted(failing, reverse=True) and failing[-1] < 8 and len(failing) < 12, failing
    assert steps_until_drafting(spec, req) == 4  # the pause, then one probe of at least one draft
    spec.record(req, len(req.spec_token_ids), 0)  # a failed probe: twice as long
    assert steps_until_drafting(spec, req) == 8


def run_steps(spec: SpecDecoder, req: Request, seconds, accepted, steps: int) -> list[int]:
    """Drive the rule for `steps` steps: a step of R rows takes seconds(R); `accepted(step, k)` of its k
    drafts are kept. -> the draft length of each step."""
    lengths = []
    for step in range(steps):
        req.spec_token_ids = []
        spec.propose([req])
        k = len(req.spec_token_ids)
        if k:
            spec.record(req, k, accepted(step, k))
        spec.observe_step(1 + k, 1, seconds(1 + k))
        lengths.append(k)
    return lengths


def test_rows_that_cost_more_draft_less() -> None:
    """A request whose drafts are all accepted 3 steps in 4: where rows are nearly free it drafts all 8,
    where each row costs half a step it keeps to short drafts (2-5, after each failure from 2 up)."""
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=8)
    cheap, dear = SpecDecoder(cfg, 4096), SpecDecoder(cfg, 4096)
    def accept(step: int, k: int) -> int:
        return k if step % 4 else 0
    tail_cheap = run_steps(cheap, decoding(), lambda r: 0.010 + 0.0001 * (r - 1), accept, 200)[-40:]
    tail_dear = run_steps(dear, decoding(), lambda r: 0.010 + 0.005 * (r - 1), accept, 200)[-40:]
    drafted_cheap = [k for k in tail_cheap if k]
    drafted_dear = [k for k in tail_dear if k]
    assert drafted_cheap and sum(k == 8 for k in drafted_cheap) >= 0.8 * len(drafted_cheap), tail_cheap
    assert drafted_dear and sum(drafted_dear) / len(drafted_dear) <= 4.0 and max(drafted_dear) <= 6, tail_dear
    big = SpecDecoder(cfg, 4096)
    big.observe_step(9, 3, 0.001)  # more requests than max_batch_size: not a step drafting sees
    assert not big.cost.observed


def test_a_request_that_always_drafts_still_gets_the_cost_measured() -> None:
    """Every draft accepted: each step has the same rows, which cannot tell what a row costs; one step in
    8 then drafts nothing, until the fit holds."""
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=4)
    spec, req = SpecDecoder(cfg, 4096), decoding()
    skipped = []
    for step in range(40):
        req.spec_token_ids = []
        spec.propose([req])
        n = len(req.spec_token_ids)
        spec.observe_step(1 + n, 1, 0.010 + 0.004 * n)  # t(R) = 6 ms + 4 ms R
        if n:
            spec.record(req, n, n)
        else:
            skipped.append(step)
    assert 1 <= len(skipped) <= 3, skipped  # a step without drafts now and then, until the line is known
    assert abs(spec.cost.row_cost(1) - 0.4) < 1e-6


def test_a_window_of_drafting_that_loses_time_pauses_everybody() -> None:
    """Steps with drafts that give fewer tokens per second than steps without (whatever the per-request
    estimates said): after a window of _GAIN_WINDOW of them nobody drafts for backoff_steps, then twice as
    long after another losing window; a window that pays ends the doubling."""
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=4, backoff_steps=10)
    spec, req = SpecDecoder(cfg, 4096), decoding()
    for _ in range(3):
        spec.observe_step(1, 1, 0.010)  # plain steps: a token per 10 ms

    def window(accepted: int) -> None:
        for _ in range(_GAIN_WINDOW):  # 4 drafts, `accepted` kept, in 30 ms
            spec.record(req, 4, accepted)
            spec.observe_step(5, 1, 0.030)

    def steps_without_drafts() -> int:
        n = 0
        while True:
            req.spec_token_ids, req.spec_state = [], None  # a fresh request state: only the window pauses
            spec.propose([req])
            if req.spec_token_ids:
                return n
            n += 1
            spec.observe_step(1, 1, 0.010)

    assert steps_without_drafts() == 0
    window(1)  # 2 tokens in 30 ms, against 3 in 30 ms without drafts
    assert abs(spec.gain - 2 / 3) < 1e-9 and spec.num_pauses == 1
    assert steps_without_drafts() == 10
    window(1)
    assert steps_without_drafts() == 20  # a second losing window in a row: twice as long
    window(4)  # 5 tokens in 30 ms: pays
    assert spec.gain > 1.6 and spec.num_pauses == 2 and steps_without_drafts() == 0
    window(1)
    assert steps_without_drafts() == 10  # the doubling started over


def test_num_speculative_tokens_defaults_by_method_and_an_explicit_one_is_kept() -> None:
    # prompt lookup's ceiling is higher (its drafts cost nothing to make); a drafting model's stays at 4
    assert SpeculativeConfig().max_drafts == 6
    assert SpeculativeConfig.parse('{"method": "ngram"}').max_drafts == 6  # type: ignore[union-attr]
    assert SpeculativeConfig(method="layer_skip").max_drafts == 4
    assert SpeculativeConfig(method="draft_model", model="x.gguf").num_speculative_tokens == 4
    assert SpeculativeConfig.parse('{"num_speculative_tokens": 3}').max_drafts == 3  # type: ignore[union-attr]
    for bad in (0, 17):
        try:
            SpeculativeConfig(num_speculative_tokens=bad)
        except ValueError as e:
            assert "between 1 and 16" in str(e)
        else:
            raise AssertionError(f"num_speculative_tokens={bad} was accepted")


def test_ngram_drafts_reach_the_default_ceiling_on_a_verbatim_copy() -> None:
    # a request that keeps accepting drafts the method's default ceiling, not the old 4
    spec = SpecDecoder(SpeculativeConfig(draft_length="fixed"), max_model_len=4096)
    r = Request("r", list(range(40)) * 2, SamplingParams(max_tokens=100), 100, frozenset(), None)
    r.token_ids.extend(range(10))  # the output so far repeats the prompt's start: the lookup continues it
    r.num_computed_tokens = len(r.token_ids) - 1
    spec.propose([r])
    assert r.spec_token_ids == list(range(10, 16))


def test_flag_values_that_do_not_read_say_which_flag_and_why() -> None:
    import pytest

    from tokenmill.config import parse_size

    with pytest.raises(ValueError, match=r"--speculative-config is not valid JSON \(Expecting property name"):
        SpeculativeConfig.parse("{bad")
    with pytest.raises(ValueError, match="a size must be positive, got '-1GiB'"):
        parse_size("-1GiB")
    assert parse_size("1.5KiB") == 1536
