"""Speculative decoding with model drafters (draft_model, layer_skip): greedy output is exactly what it is
without speculation, sampling keeps the target's distribution, and the setup refuses what cannot work.

Three drafters, from agreeing with the target most of the time to almost never, so that both accepted
and rejected drafts are exercised:
    self_q4    draft_model: the default model's own GGUF on ggml's Q4_1 kernels drafting for its fp32
               dequantized self (nearly always right; a quantized draft for a full-precision target)
    tiny       draft_model: a random 2-layer model with the default tokenizer (nearly always wrong)
    layer_skip the target's first 8 of 30 layers and its head (rarely right: the model was not trained to
               exit early; benchmarks/README.md has the measurement)
The exactness tests run at fp32 with dequantized target weights (rows independent), so "identical" means
the same token ids.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from test_spec_decode import BASE, CODE, PROMPTS, _chains, _chi2_pvalue, chat, greedy_reference, small_vocab_model
from tokenmill import LLM, SamplingParams
from tokenmill.config import SpeculativeConfig
from tokenmill.loader.model_source import default_model_path
from tokenmill.sampling_params import StructuredOutputsParams

ALWAYS = dict(num_speculative_tokens=3, max_batch_size=256, draft_length="fixed")  # speculate on every step
KV = 128 * 2**20  # room for a draft model's cache too


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    return write_random_gguf(tmp_path_factory.mktemp("draft") / "tiny.gguf",
                             Shape(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1), "f32")


def configs(tiny: Path) -> dict[str, SpeculativeConfig]:
    return {"self_q4": SpeculativeConfig(method="draft_model", model=str(default_model_path()), quantization="auto",
                                         **ALWAYS),  # type: ignore[arg-type]
            "tiny": SpeculativeConfig(method="draft_model", model=str(tiny), **ALWAYS),  # type: ignore[arg-type]
            "layer_skip": SpeculativeConfig(method="layer_skip", num_draft_layers=8, **ALWAYS)}  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM(**BASE)


@pytest.fixture(scope="module", params=["self_q4", "tiny", "layer_skip"])
def drafted(request: pytest.FixtureRequest, tiny_draft: Path) -> LLM:
    return LLM(**{**BASE, "kv_cache_memory": KV}, speculative_config=configs(tiny_draft)[request.param])


def test_greedy_identical_alone_batched_and_at_the_edges(plain: LLM, drafted: LLM) -> None:
    spec = drafted.engine.spec
    assert spec is not None
    prompts = [chat(plain, p) for p in PROMPTS]
    p = SamplingParams(temperature=0, max_tokens=16)
    want = greedy_reference(plain, 16)
    before = spec.num_draft_tokens
    assert [o.outputs[0].token_ids for o in drafted.generate(prompts, p)] == want  # batched
    assert drafted.generate(prompts[1], p)[0].outputs[0].token_ids == want[1]  # alone
    assert spec.num_draft_tokens > before + 60  # it did speculate
    if spec.config.model is None or spec.config.quantization is None:
        return  # the edges below matter where drafts are accepted: the quantized copy's
    # never past a stop string, a stop id or max_tokens, even when accepted drafts run past them
    prompt = chat(plain, f"Repeat this code exactly:\n{CODE}")
    ref = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    cases = [SamplingParams(temperature=0, max_tokens=n) for n in (1, 2, 3, 5)]
    cases += [SamplingParams(temperature=0, max_tokens=40, stop=["append"]),
              SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[ref.token_ids[9]], logprobs=1)]
    for a, b in zip(plain.generate([prompt] * len(cases), cases), drafted.generate([prompt] * len(cases), cases)):
        x, y = a.outputs[0], b.outputs[0]
        assert (y.token_ids, y.text, y.finish_reason, y.stop_reason) == (x.token_ids, x.text, x.finish_reason,
                                                                          x.stop_reason)
    assert drafted.engine.block_manager.usage == 0


def test_draft_model_acceptance_and_its_cache_reuse(plain: LLM, tiny_draft: Path) -> None:
    """The measurement behind the docstring: a quantized copy of the target agrees with it far more often
    than a random model does (the same prompt, greedy). And the draft's cache is reused like the target's
    prefix cache: the same prompt again catches the draft up on a few tokens, not the whole prompt."""
    rates = {}
    prompt = chat(plain, f"Repeat this code exactly:\n{CODE}")
    for name in ("self_q4", "tiny"):
        llm = LLM(**{**BASE, "kv_cache_memory": KV}, speculative_config=configs(tiny_draft)[name])
        drafter = llm.engine.executor.worker.runner.drafter  # type: ignore[attr-defined]
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24))
        first = drafter.num_catch_up_tokens
        assert first >= len(prompt) - 1  # a new prompt: the draft computes all of it once
        again = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].token_ids
        assert drafter.num_catch_up_tokens - first < 16 + 24  # at most the last partial block and the output
        assert again == plain.generate(prompt, SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].token_ids
        s = llm.engine.spec
        assert s is not None and s.num_draft_tokens > 0
        rates[name] = s.num_accepted_tokens / s.num_draft_tokens
    assert rates["self_q4"] > 0.6 > 0.2 > rates["tiny"], rates


def test_prefix_cache_off_and_preemption_identical(plain: LLM, tiny_draft: Path) -> None:
    """The draft's own cache follows the target's blocks through preemption and without a prefix cache
    (layer_skip keeps no cache of its own: preemption is the target's, as for n-gram drafts)."""
    prompts = [chat(plain, p) for p in PROMPTS[:8]]
    p = SamplingParams(temperature=0, max_tokens=16)
    want = greedy_reference(plain, 16)[:8]
    cfg = configs(tiny_draft)["self_q4"]
    no_cache = LLM(**{**BASE, "kv_cache_memory": KV, "enable_prefix_caching": False}, speculative_config=cfg)
    assert [o.outputs[0].token_ids for o in no_cache.generate(prompts, p)] == want
    # 18 blocks for 8 requests of ~100-200 tokens (each token's K/V twice: target and draft): preemption
    tiny = LLM(**{**BASE, "kv_cache_memory": 18 * 16 * 90 * 2**10, "max_model_len": 288}, speculative_config=cfg)
    assert tiny.engine.plan.draft_kv_bytes_per_token == tiny.engine.plan.kv_bytes_per_token // 2
    assert [o.outputs[0].token_ids for o in tiny.generate(prompts, p)] == want
    assert tiny.engine.scheduler.num_preemptions > 0
    assert tiny.engine.block_manager.usage == 0


def test_rejection_sampling_keeps_the_distribution(tmp_path: Path) -> None:
    """4000 sampled 3-token continuations with a draft model (the small target's Q4_0 copy, whose greedy
    proposals are accepted often enough at temperature 2 to exercise both branches) follow the exact
    distribution of the target alone: chi-square goodness of fit, p > 0.001 (the same test fails a biased
    verifier: tests/engine/test_spec_decode.py). A short prompt: every sequence's draft first catches up on it."""
    top_k, temperature, n_samples = 6, 2.0, 4000
    target, draft = small_vocab_model(tmp_path / "t.gguf"), small_vocab_model(tmp_path / "d.gguf", "q4_0")
    plain = LLM(model=str(target), **BASE)
    prompt = plain.tokenizer.encode("red green blue red green blue red")
    probs = _chains(plain, prompt, top_k, temperature)
    cfg = SpeculativeConfig(method="draft_model", model=str(draft), quantization="auto",
                            num_speculative_tokens=2, max_batch_size=1024, draft_length="fixed")
    llm = LLM(model=str(target), **{**BASE, "kv_cache_memory": KV}, speculative_config=cfg, max_num_seqs=256)
    params = [SamplingParams(n=16, temperature=temperature, top_k=top_k, max_tokens=3, seed=i, ignore_eos=True)
              for i in range(n_samples // 16)]
    outs = llm.generate([prompt] * len(params), params)
    samples = Counter(tuple(c.token_ids) for o in outs for c in o.outputs)
    s = llm.engine.spec
    assert s is not None and s.num_draft_tokens >= n_samples  # one draft each: max_tokens leaves room for one
    assert 0.2 * s.num_draft_tokens < s.num_accepted_tokens < s.num_draft_tokens
    p = _chi2_pvalue(samples, probs)
    assert p > 1e-3, f"speculative sampling departs from the target distribution (p = {p:.2g})"


def test_structured_output_with_a_draft_model(drafted: LLM) -> None:
    """Constrained requests validate; they do not speculate with a model drafter (its drafts are not known
    before the step that would need their grammar masks), their unconstrained neighbours do."""
    schema = {"type": "object", "additionalProperties": False, "required": ["items"],
              "properties": {"items": {"type": "array", "minItems": 2, "maxItems": 4,
                                       "items": {"enum": ["apple", "banana", "cherry"]}}}}
    s = drafted.engine.spec
    assert s is not None
    before = s.num_drafts
    constrained = [SamplingParams(temperature=t, seed=i, max_tokens=60,
                                  structured_outputs=StructuredOutputsParams(json=schema))
                   for i, t in enumerate((0.0, 1.0))]
    prompts = [chat(drafted, "List fruits as JSON: apple, banana, cherry.")] * 3
    outs = drafted.generate(prompts, [*constrained, SamplingParams(temperature=0, max_tokens=16)])
    for o in outs[:2]:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    assert s.num_drafts > before


def test_setup_refuses_what_cannot_work(tmp_path: Path) -> None:
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    other = write_random_gguf(tmp_path / "padded.gguf", Shape(hidden=64, intermediate=128, layers=1, heads=2,
                                                             kv_heads=1, vocab=49160), "f32")
    with pytest.raises(ValueError, match="vocabulary has 49160 tokens, the target's 49152"):
        LLM(**BASE, speculative_config=SpeculativeConfig(method="draft_model", model=str(other)))
    with pytest.raises(ValueError, match="below the model's 30 layers"):
        LLM(**BASE, speculative_config=SpeculativeConfig(method="layer_skip", num_draft_layers=30))
    for bad, match in (({"method": "draft_model"}, "needs \"model\""),
                       ({"method": "ngram", "model": "x.gguf"}, "draft_model method's field"),
                       ({"method": "ngram", "num_draft_layers": 4}, "layer_skip method's field"),
                       ({"method": "draft_model", "model": "x", "quantization": "q9"}, "one of auto"),
                       ({"method": "ngram", "draft_length": "long"}, 'draft_length must be "adaptive" or "fixed"'),
                       ({"method": "ngram", "backoff_steps": 0}, "backoff_steps must be at least 1")):
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig.parse(json.dumps(bad))
