"""Speculative decoding (n-gram prompt lookup): greedy output is exactly what it is without it, sampling
keeps the target's distribution, and drafts never leak blocks, pass a stop, or break a grammar.

The exactness tests run at fp32 with dequantized weights (rows independent, as in test_invariance.py),
so "identical" means the same token ids.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from scipy.stats import chi2

from tokenmill import LLM, SamplingParams
from tokenmill.config import SpeculativeConfig
from tokenmill.engine.ngram_proposer import NgramIndex, propose
from tokenmill.sampling_params import StructuredOutputsParams

BASE = dict(progress=False, dtype="float32", quantization="dequantize", max_model_len=1024,
            kv_cache_memory=64 * 2**20)
# max_batch_size high: these tests check correctness, so speculation stays on however many requests run
SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=4, max_batch_size=256,
                         draft_length="fixed")

CODE = '''def merge(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
'''
DOC = ("The harbour opened in 1821. Ships brought tea, cotton and coal. By 1900 the harbour handled a "
       "million tons a year, and the town around it grew to forty thousand people.")
PROMPTS = [
    f"Repeat this code exactly:\n{CODE}", f"Rename `out` to `result` in this code:\n{CODE}",
    f"Summarise, quoting the text: {DOC}", f"Copy this sentence twice: {DOC}",
    "1, 2, 3, 4, 5, 6, 7, 8,", "a b c a b c a b c a b", "The capital of France is",
    "Write a haiku about rain.", "List the days of the week.", "def fibonacci(n):",
    "Translate to French: good morning, good evening, good night.", "Explain what a hash map is.",
    "Once upon a time", "<html><body><p>hello</p><p>", "SELECT name FROM users WHERE", "Q: 2+2? A: 4. Q: 3+3? A:",
]


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM(**BASE)


@pytest.fixture(scope="module")
def spec() -> LLM:
    # as vLLM's LLM takes it: a dict of the config's fields
    llm = LLM(**BASE, speculative_config=dict(vars(SPEC)))
    assert llm.engine.config.speculative_config == SPEC
    return llm


def test_offline_speculative_config_is_checked_before_loading() -> None:
    with pytest.raises(ValueError, match="unknown speculative-config field.*num_tokens"):
        LLM(**BASE, speculative_config={"method": "ngram", "num_tokens": 4})
    with pytest.raises(ValueError):
        LLM(**BASE, speculative_config='{"method": "medusa"}')


def chat(llm: LLM, text: str) -> list[int]:
    return llm.engine.input_processor.render_chat_ids([{"role": "user", "content": text}], True)


def greedy_reference(plain: LLM, max_tokens: int) -> list[list[int]]:
    """plain's greedy tokens for each of PROMPTS (as a chat), generated once per engine and max_tokens:
    at fp32 on dequantized weights a row's tokens do not depend on its batch, so every test that compares
    against a subset of them may share one batched run."""
    cache: dict[int, list[list[int]]] = plain.__dict__.setdefault("_greedy_reference", {})
    if max_tokens not in cache:
        p = SamplingParams(temperature=0, max_tokens=max_tokens)
        cache[max_tokens] = [o.outputs[0].token_ids for o in plain.generate([chat(plain, t) for t in PROMPTS], p)]
    return cache[max_tokens]


def test_ngram_proposer() -> None:
    ix = NgramIndex()
    assert propose(ix.sync([1, 2, 3, 4, 5, 9, 1, 2, 3]), 4, 2, 5) == [4, 5, 9, 1]  # the longest, latest match
    assert propose(ix.sync([1, 2, 3, 4, 5, 9, 1, 2, 3, 7]), 4, 2, 5) == []  # "3 7" never came before
    assert propose(ix.sync([8, 1, 2, 8, 1, 3, 8, 1]), 2, 1, 2) == [3, 8]  # "8 1" last seen before "3"
    assert propose(NgramIndex().sync([5]), 3, 1, 3) == []


def test_greedy_identical_alone_and_batched(plain: LLM, spec: LLM) -> None:
    prompts = [chat(plain, p) for p in PROMPTS]
    p = SamplingParams(temperature=0, max_tokens=32)
    want = greedy_reference(plain, 32)
    before = spec.engine.spec.num_accepted_tokens  # type: ignore[union-attr]
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, p)] == want  # batched
    for i in (0, 5):  # alone
        assert spec.generate(prompts[i], p)[0].outputs[0].token_ids == want[i]
    assert spec.engine.spec.num_accepted_tokens > before + 30  # type: ignore[union-attr]  # it did speculate


def test_stops_and_max_tokens_edges(plain: LLM, spec: LLM) -> None:
    """Never past a stop string, a stop id or max_tokens, even when accepted drafts run past them."""
    prompt = chat(plain, f"Repeat this code exactly:\n{CODE}")
    ref = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=60))[0].outputs[0]
    cases = [SamplingParams(temperature=0, max_tokens=n) for n in (1, 2, 3, 5, 17)]
    cases += [SamplingParams(temperature=0, max_tokens=60, stop=["append"]),
              SamplingParams(temperature=0, max_tokens=60, stop=["i += 1"], include_stop_str_in_output=True),
              SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[ref.token_ids[9]]),
              SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[ref.token_ids[20]], logprobs=2)]
    want, got = plain.generate([prompt] * len(cases), cases), spec.generate([prompt] * len(cases), cases)
    for p, wa, gb in zip(cases, want, got):
        a, b = wa.outputs[0], gb.outputs[0]
        assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (a.token_ids, a.text, a.finish_reason,
                                                                          a.stop_reason), p
        if p.logprobs is not None:
            assert b.logprobs is not None and a.logprobs is not None
            assert [x.token_id for x in b.logprobs] == b.token_ids
            assert [round(x.logprob, 4) for x in b.logprobs] == [round(x.logprob, 4) for x in a.logprobs]


def test_prefix_cache_off_and_preemption_identical(plain: LLM) -> None:
    prompts = [chat(plain, p) for p in PROMPTS[:8]]
    p = SamplingParams(temperature=0, max_tokens=32)
    want = greedy_reference(plain, 32)[:8]
    no_cache = LLM(**{**BASE, "enable_prefix_caching": False}, speculative_config=SPEC)
    assert [o.outputs[0].token_ids for o in no_cache.generate(prompts, p)] == want
    # ~22 blocks of 16 tokens for 8 requests of ~100-200 tokens: preemption is certain
    tiny = LLM(**{**BASE, "kv_cache_memory": 22 * 16 * 45 * 2**10, "max_model_len": 352}, speculative_config=SPEC)
    assert [o.outputs[0].token_ids for o in tiny.generate(prompts, p)] == want
    assert tiny.engine.scheduler.num_preemptions > 0
    assert tiny.engine.block_manager.usage == 0


def test_structured_output_under_speculation(plain: LLM, spec: LLM) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["items"],
              "properties": {"items": {"type": "array", "minItems": 3, "maxItems": 6,
                                       "items": {"enum": ["apple", "banana", "cherry"]}}}}
    prompts = [chat(spec, "List fruits as JSON: apple, banana, cherry, apple, banana, cherry.")] * 4
    before = spec.engine.spec.num_drafts  # type: ignore[union-attr]
    outs = spec.generate(prompts, [SamplingParams(temperature=t, seed=i, max_tokens=80,
                                                  structured_outputs=StructuredOutputsParams(json=schema))
                                   for i, t in enumerate((0.0, 0.7, 1.0, 1.0))])
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    assert spec.engine.spec.num_drafts > before  # type: ignore[union-attr]
    greedy = SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=schema))
    assert outs[0].outputs[0].token_ids == plain.generate(prompts[0], greedy)[0].outputs[0].token_ids


# The distribution tests run on a tiny random model with a small vocabulary (the default tokenizer stopped
# at 512 tokens): logits and sampling cost little, so thousands of samples take seconds. std=1.0 makes its
# next-token distributions peaked, as a trained model's are (the top token 0.4-0.9 at temperature 1).
SMALL = dict(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1, vocab=512)


def small_vocab_model(path: Path, mix: str = "f32") -> Path:
    """The tiny target (mix "f32"); the same seed in a quantized mix is its quantized copy."""
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    return write_random_gguf(path, Shape(**SMALL), mix, std=1.0)  # type: ignore[arg-type]


def test_a_small_vocabulary_is_the_default_tokenizer_stopped_early(tmp_path: Path) -> None:
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer import Tokenizer

    small = Tokenizer.from_gguf_file(small_vocab_model(tmp_path / "s.gguf"))
    full = Tokenizer.from_gguf_file(default_model_path())
    for text in ("red green blue", "héllo wörld 😀\n\tdef f(x): return x", "<|im_start|>user"):
        ids = small.encode(text)
        assert max(ids) < SMALL["vocab"] and small.decode(ids, skip_special_tokens=False) == text
        assert len(ids) >= len(full.encode(text))
    assert small.encode("<|im_start|>") == full.encode("<|im_start|>")  # specials keep their ids


def lookup_prompt(llm: LLM, text: str) -> list[int]:
    """`text`'s tokens with its second and third set to the model's two greedy next tokens after the whole
    prompt: when the first sampled token is the likeliest, prompt lookup drafts the likeliest second one,
    so drafts are accepted often but not always. Found as a fixed point: set the two tokens until they
    are what greedy decoding continues with."""
    prompt = llm.tokenizer.encode(text)
    for _ in range(8):
        nxt = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2))[0].outputs[0].token_ids
        if prompt[1:3] == nxt and prompt.count(nxt[0]) == 1:
            return prompt
        prompt[1:3] = nxt
    raise AssertionError("no fixed point: pick another text")


def _chains(llm: LLM, prompt: list[int], top_k: int, temperature: float) -> dict[tuple[int, ...], float]:
    """The exact probability of every 3-token continuation under `temperature` and top_k, from the
    model's raw logprobs (top-k, then the temperature, renormalised), without speculation."""
    def step(prefixes: list[list[int]]) -> list[dict[int, float]]:
        outs = llm.generate(prefixes, SamplingParams(temperature=0, max_tokens=1, logprobs=top_k))
        dists = []
        for o in outs:
            top = o.outputs[0].logprobs[0].top  # type: ignore[index]
            z = sum(math.exp(t.logprob / temperature) for t in top)
            dists.append({t.token_id: math.exp(t.logprob / temperature) / z for t in top})
        return dists

    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(3):
        keys = list(probs)
        nxt: dict[tuple[int, ...], float] = {}
        for key, dist in zip(keys, step([prompt + list(k) for k in keys])):
            for t, q in dist.items():
                nxt[key + (t,)] = probs[key] * q
        probs = nxt
    return probs


def _chi2_pvalue(samples: Counter[tuple[int, ...]], probs: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit of the sampled chains to the exact ones; cells expected below 5 are pooled."""
    n = sum(samples.values())
    stat, df, pool_e, pool_o = 0.0, -1, 0.0, 0
    for key, p in probs.items():
        e, o = n * p, samples.get(key, 0)
        if e < 5:
            pool_e, pool_o = pool_e + e, pool_o + o
        else:
            stat, df = stat + (o - e) ** 2 / e, df + 1
    pool_o += sum(c for k, c in samples.items() if k not in probs)
    if pool_e > 0:
        stat, df = stat + (pool_o - pool_e) ** 2 / pool_e, df + 1
    return float(chi2.sf(stat, df))


def test_rejection_sampling_keeps_the_distribution(tmp_path: Path) -> None:
    """4000 sampled 3-token continuations with speculation on (two drafts, then the bonus token) follow the
    exact distribution the model gives without it: a chi-square goodness-of-fit test, p > 0.001. A
    verifier that keeps a wrong draft half the time (a biased acceptance) fails the same test."""
    top_k, temperature, n_samples = 6, 2.0, 4000
    model = str(small_vocab_model(tmp_path / "small.gguf"))
    plain = LLM(model=model, **BASE)
    # n = 16 siblings share the prompt's full blocks, and each writes its own after them
    prompt = lookup_prompt(plain, "red green blue, then yellow and a little purple; grey at the end")
    probs = _chains(plain, prompt, top_k, temperature)
    llm = LLM(model=model, **BASE, speculative_config=SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=1,
                                                                         max_batch_size=1024, draft_length="fixed"),
              max_num_seqs=256)
    # ignore_eos: the small vocabulary keeps <|endoftext|>, and a chain it ended would be shorter than 3
    params = [SamplingParams(n=16, temperature=temperature, top_k=top_k, max_tokens=3, seed=i, ignore_eos=True)
              for i in range(n_samples // 16)]
    spec = llm.engine.spec
    assert spec is not None

    def sample() -> Counter[tuple[int, ...]]:
        outs = llm.generate([prompt] * len(params), params)
        return Counter(tuple(c.token_ids) for o in outs for c in o.outputs)

    good = _chi2_pvalue(sample(), probs)
    assert spec.num_draft_tokens > n_samples // 2  # drafts ran, and both branches did:
    assert 0.1 * spec.num_draft_tokens < spec.num_accepted_tokens < 0.9 * spec.num_draft_tokens
    assert good > 1e-3, f"speculative sampling departs from the target distribution (p = {good:.2g})"

    rng = random.Random(0)

    def biased(sampled: list[int], drafts: list[int]) -> int:
        n = 0
        while n < len(drafts) and (sampled[n] == drafts[n] or rng.random() < 0.5):
            n += 1
        return n

    llm.engine.executor.worker.runner.verify = biased  # type: ignore[attr-defined]
    bad = _chi2_pvalue(sample(), probs)
    assert bad < 1e-6, f"the test cannot tell a biased acceptance from a correct one (p = {bad:.2g})"


def test_metrics_carry_vllms_spec_decode_names(spec: LLM) -> None:
    from tokenmill.metrics import ServerMetrics

    spec.generate(chat(spec, f"Repeat this code exactly:\n{CODE}"), SamplingParams(temperature=0, max_tokens=24))
    text = ServerMetrics("m", spec.engine.stats, log_requests=False).render().decode()
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("tokenmill:spec_decode") and 'position="0"' in line or
              line.startswith("tokenmill:spec_decode_num_")}
    for name in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos"):
        assert values[f"tokenmill:spec_decode_num_{name}_total"] > 0, name
    assert values["tokenmill:spec_decode_num_draft_tokens_total"] >= values["tokenmill:spec_decode_num_accepted_tokens_total"]
    # --metrics-prefix vllm: the same families under vLLM's own names, which its dashboards read
    vllm = ServerMetrics("tokenmill:model", spec.engine.stats, log_requests=False, prefix="vllm:").render().decode()
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(vllm)}
    assert {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:time_to_first_token_seconds"} <= names, names
    assert all(n.startswith("vllm:") for n in names)
    assert 'model_name="tokenmill:model"' in vllm  # label values keep their text
