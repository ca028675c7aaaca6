"""Beam search (engine/beam_search.py, on the engine's batching and prefix cache) against transformers'
`generate(num_beams=W)` on the same weights at fp32: the same W hypotheses, in the same order, with the
same scores, with and without beams that end on an end-of-turn token, for several length penalties and
early-stopping rules; plus the state machine's own rules on hand-made candidates."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine.beam_search import BeamSearch, BeamSearchParams
from tokenmill.sampling_params import ParamError

CASES = [  # prompt, width, max_tokens, length_penalty, early_stopping
    ("The capital of France is", 3, 8, 1.0, False),
    ("def fibonacci(n):\n", 4, 10, 1.0, False),
    ("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n", 3, 24, 1.0, False),
    ("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n", 2, 20, 0.5, True),
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", 3, 16, 2.0, "never"),
]


def hf_beams(reference, ids: list[int], width: int, max_tokens: int, lp: float, es, eos: list[int]):
    from transformers import GenerationConfig

    cfg = GenerationConfig(num_beams=width, num_return_sequences=width, do_sample=False, max_new_tokens=max_tokens,
                           length_penalty=lp, early_stopping=es, eos_token_id=eos, pad_token_id=eos[0],
                           output_scores=True, return_dict_in_generate=True)
    with torch.inference_mode():
        out = reference.generate(torch.tensor([ids]), generation_config=cfg, attention_mask=torch.ones(1, len(ids)))
    hyps = []
    for seq, score in zip(out.sequences, out.sequences_scores):
        gen = seq[len(ids):].tolist()
        for j, t in enumerate(gen):
            if t in eos:
                gen = gen[: j + 1]
                break
        hyps.append((gen, float(score)))
    return hyps


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"w{c[1]}-lp{c[2]}-{c[3]}-{c[4]}")
def test_beam_search_equals_transformers(llm, reference, case) -> None:
    prompt, width, max_tokens, lp, es = case
    ids = llm.tokenizer.encode(prompt)
    eos = sorted(llm.tokenizer.eog_token_ids)
    ours = llm.beam_search([ids], BeamSearchParams(width, max_tokens, lp, es))[0]
    ref = hf_beams(reference, ids, width, max_tokens, lp, es, eos)
    assert [h.token_ids for h in ours] == [g for g, _ in ref]
    assert [h.score for h in ours] == pytest.approx([s for _, s in ref], abs=1e-3)
    assert all(h.text == llm.tokenizer.decode(h.token_ids) for h in ours)
    if es is True:  # the case that ends on end-of-turn tokens: the EOS path is exercised
        assert all(h.finished_by_eos and h.token_ids[-1] in eos for h in ours)


def test_several_prompts_run_together_as_they_do_alone(llm) -> None:
    prompts = [c[0] for c in CASES[:3]]
    params = BeamSearchParams(3, 8)
    together = llm.beam_search(prompts, params)
    for p, hyps in zip(prompts, together):
        alone = llm.beam_search(p, params)[0]
        assert [h.token_ids for h in hyps] == [h.token_ids for h in alone]


def test_rules_on_hand_made_candidates() -> None:
    """Width 2, end token 9: a top-2 candidate that ends is kept as finished with its length-penalised
    score; the running beams are the best two that do not end; the search stops when no running beam
    can beat the worst finished one."""
    s = BeamSearch([1, 2], BeamSearchParams(2, 5, length_penalty=1.0), frozenset({9}))
    assert s.pending() == [[1, 2]]
    s.advance([[(9, -0.1), (3, -0.5), (4, -0.7)]])
    assert [(h.token_ids, h.score) for h in s.finished] == [([9], -0.1)]
    assert s.beams == [([3], -0.5), ([4], -0.7)] and not s.done
    s.advance([[(9, -0.2), (5, -1.0), (6, -2.0)], [(9, -3.0), (7, -0.1), (8, -4.0)]])
    # pool: [3,9] -0.7 (ends, top 2), [4,7] -0.8, [3,5] -1.5, ...; both finished slots are now full
    assert [h.token_ids for h in s.finished] == [[9], [3, 9]]
    assert s.finished[1].score == pytest.approx(-0.7 / 2)
    assert s.beams[0] == ([4, 7], pytest.approx(-0.8))
    assert s.done  # best running -0.8 / 2 = -0.4 does not beat the worst finished -0.35


def test_bad_beam_params_name_the_field() -> None:
    with pytest.raises(ParamError) as e:
        BeamSearchParams(0, 8)
    assert e.value.field == "n"
    with pytest.raises(ParamError) as e:
        BeamSearchParams(2, 8, early_stopping="sometimes")  # type: ignore[arg-type]
    assert e.value.field == "early_stopping"
