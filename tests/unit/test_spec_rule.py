"""The rule that turns speculation off where it does not pay (engine/spec_decode.py), torch-free: a request
whose drafts keep failing pauses, each consecutive pause twice as long, and one accepted probe ends the
doubling; with a model drafter the drafts are placeholders cut like n-gram ones."""

from __future__ import annotations

from tokenmill.config import SpeculativeConfig
from tokenmill.engine.request import Request
from tokenmill.engine.spec_decode import SpecDecoder
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
    cfg = SpeculativeConfig(method="layer_skip", num_speculative_tokens=4, backoff_steps=16)
    spec, req = SpecDecoder(cfg, 4096), decoding()
    spec.propose([req])
    assert req.spec_token_ids == [DRAFT_PLACEHOLDER] * 4
    spec.record(req, 4, 0)  # 1.0 -> 0.7: still above 0.5
    assert steps_until_drafting(spec, req) == 0
    spec.record(req, 4, 0)  # 0.49: pause
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
