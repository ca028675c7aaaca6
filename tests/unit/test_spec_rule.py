"""The rule that keeps speculation where it pays (engine/spec_decode.py, engine/step_cost.py), torch-free: a
request whose drafts keep failing pauses, each consecutive pause twice as long, and one accepted probe ends
the doubling; the adaptive draft length follows the request's acceptance and the measured cost of a row;
with a model drafter the drafts are placeholders cut like n-gram ones."""

from __future__ import annotations

from tokenmill.config import SpeculativeConfig
from tokenmill.engine.request import Request
from tokenmill.engine.spec_decode import SpecDecoder
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


def test_rows_that_cost_more_draft_less() -> None:
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=8)
    cheap, dear = SpecDecoder(cfg, 4096), SpecDecoder(cfg, 4096)
    for _ in range(30):
        cheap.observe_step(1, 1, 0.010), cheap.observe_step(9, 1, 0.011)
        dear.observe_step(1, 1, 0.010), dear.observe_step(9, 1, 0.050)
        dear.observe_step(9, 3, 0.001)  # more requests than max_batch_size: not a step drafting sees
    a, b = cheap.cost.row_cost(1), dear.cost.row_cost(1)
    assert a < 0.05 and abs(b - 0.5) < 1e-6
    reqs = []
    for spec in (cheap, dear):
        req = decoding()
        req.spec_state = None
        spec.propose([req])
        reqs.append(len(req.spec_token_ids))
    assert reqs[0] == 8 and 1 <= reqs[1] < 4


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
