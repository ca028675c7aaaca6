"""Sampler: exact masks on fixed logits, penalties and logit_bias moving the distribution as specified,
seeded rows reproducible and independent of their neighbours."""

from __future__ import annotations

import math

import torch

from dataclasses import dataclass, field

from tokenmill.sample.logits_processor import LogitBiasProcessor, MinTokensProcessor, PenaltiesProcessor
from tokenmill.sample.sampler import SamplingBatch, argmax_only, filtered_probs, sample
from tokenmill.sampling_params import SamplingParams

V = 8
LOGITS = torch.log(torch.tensor([[0.30, 0.25, 0.15, 0.12, 0.08, 0.05, 0.03, 0.02]]))


@dataclass
class Row:
    """A sampling row as a logits processor sees it (the runner's per-request state)."""

    sampling_params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]


CPU = torch.device("cpu")


def apply_penalties(logits: torch.Tensor, row: Row) -> torch.Tensor:
    proc = PenaltiesProcessor(logits.shape[1], CPU)
    assert proc.prepare([row])
    return proc.apply(logits)


def batch(S: int = 1, temperature: float = 1.0, **kw) -> SamplingBatch:
    b = SamplingBatch(temperature=torch.full((S,), temperature), top_k=None, top_p=None, min_p=None,
                      generators=[None] * S, all_greedy=temperature == 0)
    for k, v in kw.items():
        setattr(b, k, v)
    return b


def kept(probs: torch.Tensor) -> list[int]:
    return (probs[0] > 0).nonzero().flatten().tolist()


def test_top_k_keeps_exactly_k() -> None:
    assert kept(filtered_probs(LOGITS, batch(top_k=torch.tensor([3])))) == [0, 1, 2]
    assert kept(filtered_probs(LOGITS, batch(top_k=torch.tensor([V])))) == list(range(V))


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    # cumulative: .30 .55 .70 .82 .90 ...
    assert kept(filtered_probs(LOGITS, batch(top_p=torch.tensor([0.55])))) == [0, 1]
    assert kept(filtered_probs(LOGITS, batch(top_p=torch.tensor([0.56])))) == [0, 1, 2]
    assert kept(filtered_probs(LOGITS, batch(top_p=torch.tensor([0.1])))) == [0]


def test_min_p_relative_to_top() -> None:
    # threshold 0.5 * 0.30 = 0.15: keeps .30 .25 .15
    assert kept(filtered_probs(LOGITS, batch(min_p=torch.tensor([0.5])))) == [0, 1, 2]


def test_temperature_sharpens() -> None:
    hot = filtered_probs(LOGITS, batch(temperature=2.0))
    cold = filtered_probs(LOGITS, batch(temperature=0.5))
    assert cold[0, 0] / cold[0].sum() > hot[0, 0] / hot[0].sum()


def test_penalties_move_logits_as_specified() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    b = Row(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [3], [3, 0, 0, 1])  # outputs 0 0 1
    out = apply_penalties(logits, b)
    # token 0 seen twice: -0.5 - 2*0.25; token 1 once: -0.5 - 0.25; others untouched
    assert torch.allclose(out, torch.tensor([[2.0 - 1.0, -1.0 - 0.75, 0.5, 0.0]]))
    b = Row(SamplingParams(repetition_penalty=2.0), [0], [0, 1])  # prompt and output seen: 0 and 1
    out = apply_penalties(logits, b)
    assert torch.allclose(out, torch.tensor([[1.0, -2.0, 0.5, 0.0]]))  # positive /2, negative *2
    # a window (llama.cpp's penalty_last_n, Ollama's repeat_last_n): only the last W tokens count
    b = Row(SamplingParams(repetition_penalty=2.0, penalty_window=1), [0], [0, 1])  # only token 1 is in it
    assert torch.allclose(apply_penalties(logits, b), torch.tensor([[2.0, -2.0, 0.5, 0.0]]))
    b = Row(SamplingParams(frequency_penalty=0.25, penalty_window=2), [3], [3, 0, 0, 1])  # outputs 0 1 counted
    assert torch.allclose(apply_penalties(logits, b), torch.tensor([[1.75, -1.25, 0.5, 0.0]]))


def test_logit_bias_and_banned_tokens() -> None:
    bias = LogitBiasProcessor(CPU)
    assert bias.prepare([Row(SamplingParams(logit_bias={7: 100.0}))])
    assert sample(LOGITS, batch(temperature=0.0), [bias]).token_ids == [7]
    banned = MinTokensProcessor(frozenset({0}), CPU)  # token 0 is EOS; no output yet, min_tokens 1
    assert banned.prepare([Row(SamplingParams(min_tokens=1), [5], [5])])
    assert sample(LOGITS, batch(temperature=0.0), [banned]).token_ids == [1]


def test_allowed_token_ids_mask_the_rest() -> None:
    """vLLM's allowed_token_ids: only those can be sampled (greedy takes the best of them); other rows keep
    their logits bit for bit."""
    proc = LogitBiasProcessor(CPU)
    assert proc.prepare([Row(SamplingParams(allowed_token_ids=[2, 3])), Row(SamplingParams())])
    logits = torch.randn(2, 8)
    out = proc.apply(logits)
    assert torch.isinf(out[0, [0, 1, 4, 5, 6, 7]]).all() and torch.equal(out[0, [2, 3]], logits[0, [2, 3]])
    assert torch.equal(out[1], logits[1])


def test_logprobs_and_rank_of_sampled_token() -> None:
    b = batch(temperature=0.0, max_logprobs=3)
    out = sample(LOGITS, b)
    assert out.token_ids == [0]
    assert math.isclose(float(out.logprobs[0]), math.log(0.30), rel_tol=1e-5)
    assert int(out.ranks[0]) == 1
    assert out.top_ids[0].tolist() == [0, 1, 2]


def test_seeded_rows_reproducible_and_independent_of_neighbours() -> None:
    logits = torch.randn(1, 1000)

    def draw(extra_rows: int, seed: int = 7) -> list[int]:
        rows = torch.cat([logits, torch.randn(extra_rows, 1000)])
        g = torch.Generator().manual_seed(seed)
        gens = [g] + [None] * extra_rows
        toks = []
        for _ in range(20):
            b = batch(S=1 + extra_rows, temperature=1.0, generators=gens, all_greedy=False)
            toks.append(sample(rows, b).token_ids[0])
        return toks

    a, b_, c = draw(0), draw(5), draw(0, seed=8)
    assert a == b_
    assert a != c


def test_sampling_follows_the_distribution() -> None:
    torch.manual_seed(0)
    logits = LOGITS.expand(4000, V).contiguous()
    toks = torch.tensor(sample(logits, batch(S=4000, temperature=1.0, all_greedy=False)).token_ids)
    freq = torch.bincount(toks, minlength=V).float() / 4000
    assert torch.allclose(freq, LOGITS.exp()[0], atol=0.03)


def test_top_k_beyond_vocab_is_no_cut_and_huge_seeds_work() -> None:
    """Both once crashed the engine thread; the runner must take any valid request."""
    from tokenmill.worker.model_runner import ModelRunner
    from tokenmill.worker.request_state import CachedRequestState

    runner = ModelRunner.__new__(ModelRunner)
    runner.device, runner.vocab_size, runner.shared_generator = CPU, V, torch.Generator()
    p = SamplingParams(temperature=1.0, top_k=10 * V, seed=2**70 + 3)
    r = CachedRequestState("x", [1, 2], p, p.seed, [0], 2, [1, 2])
    b = runner._prepare_sampling([r])
    assert b.top_k is None
    assert len(sample(LOGITS, b).token_ids) == 1


def test_bf16_logits_greedy_as_float32_and_widened_for_everything_else() -> None:
    """The runner hands greedy rows without logprobs their head's bf16 logits: argmax (first maximum, with
    the many ties bf16 has) equals float32's; logprobs, sampling and a processor that is not argmax-invariant
    widen them first, so they get float32's results."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert argmax_only(batch(2, 0.0), [], cpu) and not argmax_only(batch(2, 0.0), [], cuda)
    assert not argmax_only(batch(2, 0.0, max_logprobs=0), [], cpu) and not argmax_only(batch(2, 0.7), [], cpu)
    g = torch.Generator().manual_seed(0)
    for S, vocab, coarse in [(1, 1000, False), (8, 49152, True), (64, 49152, False), (3, 50257, True)]:
        x = (torch.randint(-3, 4, (S, vocab), generator=g) * 0.5 if coarse
             else torch.randn(S, vocab, generator=g)).to(torch.bfloat16)
        assert sample(x, batch(S, 0.0)).token_ids == sample(x.float(), batch(S, 0.0)).token_ids
        assert sample(x, batch(S, 0.0)).token_ids == x.float().argmax(dim=-1).tolist()
    x = torch.randn(2, V, generator=g).to(torch.bfloat16)
    got, ref = sample(x, batch(2, 0.0, max_logprobs=2)), sample(x.float(), batch(2, 0.0, max_logprobs=2))
    assert got.logprobs.dtype == torch.float32 and torch.equal(got.logprobs, ref.logprobs)
    row = Row(SamplingParams(temperature=0.0, logit_bias={5: 100.0}))
    proc = LogitBiasProcessor(CPU)
    assert proc.prepare([row, row]) and not proc.is_argmax_invariant()
    assert sample(x, batch(2, 0.0), [proc]).token_ids == [5, 5]
    seeded = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)]
    a = sample(x, batch(2, 1.0, generators=seeded)).token_ids
    seeded = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)]
    assert a == sample(x.float(), batch(2, 1.0, generators=seeded)).token_ids
