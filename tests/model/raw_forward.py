"""Teacher-forced logits of a whole prompt through an engine's model (the paged prefill path), for
comparisons against references. It writes K/V straight into blocks 0..n of the engine's cache behind
the block manager's back, so it then drops the prefix cache: no later request may hit those blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tokenmill import LLM


def prompt_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of every prompt position."""
    from tokenmill.attention.backend import AttentionContext, AttentionStep, ScheduledSeq

    eng = llm.engine
    assert not eng.has_unfinished_requests(), "the raw forward would overwrite a running request's blocks"
    T, bs = len(ids), eng.config.block_size
    runner = eng.executor.worker.runner
    step = AttentionStep(decodes=[], prefills=[ScheduledSeq("raw", 0, T, list(range(-(-T // bs))))])
    attn = AttentionContext(runner.attn_backend, runner.attn_backend.build_metadata(step), runner.kv_caches)
    try:
        with torch.inference_mode():
            hidden = runner.model.forward(torch.tensor(ids), torch.arange(T), attn)
            return runner.model.compute_logits(hidden)
    finally:
        eng.block_manager.reset_prefix_cache()


def exact_engine(path: str | Path, max_model_len: int = 256, **kw: Any) -> LLM:
    """An engine that is exact against an fp32 reference on the same weights: fp32, dequantized."""
    args: dict[str, Any] = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=max_model_len,
                                dtype="float32", quantization="dequantize")
    args.update(kw)
    return LLM(str(path), **args)


def greedy_reference(model: Any, ids: list[int], n: int) -> list[int]:
    """n greedy tokens from a transformers model, a whole forward per token (no cache to trust)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def widen_and_save(model: Any, tokenizer: Any, out: Path) -> None:
    """A tiny random transformers model made usable as a reference, then saved as an HF directory with the
    default model's tokenizer: its init is tiny, so matrices get N(0, 0.08) and norms U(0.5, 1.5) (well
    separated logits)."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            else:
                p.uniform_(0.5, 1.5)
    save_with_tokenizer(model, tokenizer, out)


def save_with_tokenizer(model: Any, tokenizer: Any, out: Path) -> None:
    """A transformers model saved as an HF directory with `tokenizer` (the default model's) and its template."""
    import json

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": tokenizer.chat_template}))


def add_hparams(w: Any, arch: str, config: Any, head_dim: int) -> None:
    """A transformers config's shape as llama.cpp's `{arch}.*` keys on the gguf.GGUFWriter `w` (the rotary
    keys are each family's own; no feed_forward_length for a config without a dense MLP)."""
    w.add_name(f"tiny {arch}")
    dense = [("feed_forward_length", config.intermediate_size)] if hasattr(config, "intermediate_size") else []
    for key, value in (("block_count", config.num_hidden_layers), ("context_length", config.max_position_embeddings),
                       ("embedding_length", config.hidden_size), *dense, ("attention.head_count", config.num_attention_heads),
                       ("attention.head_count_kv", config.num_key_value_heads),
                       ("attention.key_length", head_dim), ("attention.value_length", head_dim)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)


def logits_close_on_blocks(llm: LLM, model: Any, prompts: list[list[int]], what: str) -> None:
    """A GGUF's quantized blocks (Q8_0) held to the fp32 reference model within test_gguf_method.py's bounds
    for tiny random models (their logits are flat, so near-ties are common): relative logit error < 5e-2 per
    prompt, teacher-forced top-1 agreement >= 0.85 over all."""
    agree = total = 0
    for ids in prompts:
        with torch.inference_mode():
            want = model(torch.tensor([ids])).logits[0]
        got = prompt_logits(llm, ids)
        rel = float((got - want).norm() / want.norm())
        assert rel < 5e-2, f"{what}: relative logit error {rel:.2e}"
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= 0.85, f"{what}: top-1 agreement {agree / total:.2f}"


def assert_invariances(make_engine: Any, tokenizer: Any, subjects: list[str]) -> None:
    """At fp32 on one model: batched == alone, prefix cache on == off (hit, twice), chunked prefill == whole,
    for prompts sharing a long system prefix. `make_engine(**overrides)` builds an LLM of the model."""
    from tokenmill import SamplingParams

    system = tokenizer.encode("You are a meticulous assistant. Answer briefly and never apologise. " * 3)
    prompts = [system + tokenizer.encode(f"Question {i}: what is notable about {s}?") for i, s in enumerate(subjects)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def run(llm: LLM, batch: list[list[int]]) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(batch, params)]

    base = make_engine(enable_prefix_caching=False)
    batched = run(base, prompts)
    assert [run(base, [p])[0] for p in prompts] == batched
    cached = make_engine()
    assert run(cached, prompts) == batched and run(cached, prompts) == batched
    assert cached.engine.block_manager.num_hits > 0
    assert run(make_engine(max_num_batched_tokens=16), prompts) == batched


def grouped_against_one_by_one(llm: LLM, prompts: list[list[int]], monkeypatch: Any) -> list[bool]:
    """The prompts' logits with the experts run grouped (SparseMoE._experts_grouped: the grouped matmuls, torch's
    activation between them) equal, bit for bit, the ones with every expert called alone; -> for each grouped
    call, whether the grouped path took it. (The one-call path, whose activation is ggml's, is held to the
    grouped matmuls within a bound: test_qwen3_moe.py, test_ggml_experts.py.)"""
    import tokenmill.layers.moe as moe
    from tokenmill.layers.moe import SparseMoE

    monkeypatch.setattr(moe, "_NATIVE_ACTS", {})
    calls: list[bool] = []
    real = SparseMoE._experts_grouped

    def spy(self: Any, x: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
        out = real(self, x, counts)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(SparseMoE, "_experts_grouped", spy)
    grouped = [prompt_logits(llm, ids) for ids in prompts]
    monkeypatch.setattr(SparseMoE, "_experts_grouped", lambda self, x, counts: None)
    for ids, want in zip(prompts, grouped):
        assert torch.equal(prompt_logits(llm, ids), want)
    return calls


def ref_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """transformers' prompt logits (T, V), float32."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def hf_reference(model: Any, ids: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """transformers' fp32 prompt logits (T, V) and its n greedy tokens (generate, EOS ignored)."""
    with torch.inference_mode():
        x = torch.tensor([ids])
        logits = model(x).logits[0]
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=None, eos_token_id=None)
    return logits, out[0, len(ids):].tolist()


def assert_state_across_steps(base: LLM, path: str, engine: dict[str, Any], ids: list[list[int]],
                              small_cache: int) -> None:
    """A model with recurrent layers at fp32 (`base` an engine of `path` built with `engine`): batched == alone ==
    chunked prefill (16, 7) == preempted (a cache of `small_cache` bytes) == requests joining a running batch,
    and every state slot back afterwards."""
    from tokenmill import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def texts(outs: Any) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in outs]

    batched = texts(base.generate(ids, params))
    assert [texts(base.generate([p], params))[0] for p in ids] == batched
    for chunk in (16, 7):
        assert texts(LLM(path, **{**engine, "max_num_batched_tokens": chunk}).generate(ids, params)) == batched
    small = LLM(path, **{**engine, "kv_cache_memory": small_cache})  # requests preempted: their states start over
    assert texts(small.generate(ids, params)) == batched
    assert small.engine.scheduler.num_preemptions > 0
    eng = base.engine
    for i, p in enumerate(ids[:3]):
        eng.add_request(f"a{i}", p, params)
    for _ in range(5):
        eng.step()
    for i, p in enumerate(ids[3:]):
        eng.add_request(f"b{i}", p, params)
    done: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    assert [done[f"a{i}"] for i in range(3)] + [done[f"b{i}"] for i in range(len(ids) - 3)] == batched
    assert eng.state_cache is not None and eng.state_cache.num_running == 0
    eng.state_cache.check()


def assert_state_is_seen(llm: LLM, ids: list[list[int]]) -> Any:
    """The control for a model with recurrent layers: every sequence reading a zero state at each step (its state not
    carried) changes the greedy tokens, and they come back once that is undone, so comparisons of those tokens see
    the state. Returns the runner's state pool, for the caller's checks of its shapes."""
    from tokenmill import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    pool = llm.engine.executor.worker.runner.states
    step = pool.step

    def forgetful(seqs: Any) -> Any:
        out = step(seqs)
        for s in out.seqs:
            s.fresh = True
        return out

    pool.step = forgetful
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(ids, params)] != want
    finally:
        del pool.step
    assert [o.outputs[0].token_ids for o in llm.generate(ids, params)] == want
    return pool


def assert_prefix_cache_exact(path: str, engine: dict[str, Any], ids: list[list[int]]) -> None:
    """A model with recurrent layers at fp32: prompts that restart from a checkpoint of the state (a repeated prompt,
    prompts sharing a first part, the next turn of a chat built on the first's answer, batched or one by one) give
    the greedy tokens of an engine without prefix caching, and each of them longer than a block did restart past
    its first block."""
    from tokenmill import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    cold = LLM(path, **{**engine, "enable_prefix_caching": False})
    assert not cold.engine.prefix_caching
    warm = LLM(path, **engine)
    eng = warm.engine
    assert eng.prefix_caching and eng.plan.num_state_checkpoints > 0
    shared = ids[1][:24]  # a common first part (a system prompt), then different tails
    tails = [shared + p[:9] for p in ids]
    first = [o.outputs[0].token_ids for o in warm.generate(ids, params)]
    warm.generate(tails[:1], params)  # the second prompt of the common first part: checkpointed where it diverged
    turns = [p + out + p[3:10] for p, out in zip(ids, first)]  # each chat's next turn
    later = ids + tails[1:] + turns
    want = [o.outputs[0].token_ids for o in cold.generate(later, params)]
    hits0 = eng.block_manager.num_hits
    got = []
    for i, p in enumerate(later):  # one by one, so each restores what the ones before it left
        eng.add_request(f"p{i}", p, params)
        req = eng.scheduler.waiting[-1]
        while eng.has_unfinished_requests():
            outs = eng.step()
        got.append(outs[0].outputs[0].token_ids)
        if len(p) > eng.config.block_size:  # a prompt of one block or less has nothing to restart from
            assert req.num_cached_tokens >= eng.config.block_size, f"prompt {i} ({len(p)} tokens) restored nothing"
    assert got == want
    assert [o.outputs[0].token_ids for o in warm.generate(later, params)] == want  # batched, the cache warm
    assert eng.block_manager.num_hits > hits0 and eng.state_cache is not None
    eng.state_cache.check()
    assert eng.state_cache.num_running == 0


def close_gguf(w: Any, path: Path) -> Path:
    """Write a gguf.GGUFWriter's header, metadata and tensors to its file, close it; -> path."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def texts(outs: Any) -> list[list[int]]:
    """Each request's first completion's token ids."""
    return [o.outputs[0].token_ids for o in outs]


def native_against_layers(path: Path, prompts: list[list[int]], monkeypatch: Any, max_tokens: int = 12,
                          **engine_kw: Any) -> tuple[LLM, list[int], list[Any], list[Any]]:
    """Greedy token ids and logprobs of `prompts` on the GGUF at `path` (fp32 unless `engine_kw` says, the gguf
    method with its crossover fixed at 64 rows so every decode step fits the native step, no prefix cache), first
    layer by layer (TOKENMILL_NATIVE_DECODE=0), then with the native decode step: (the engine, the row counts of the
    native steps that ran, the layer path's outputs, the native outputs). The first run is checked to run no native
    step."""
    from tokenmill import SamplingParams
    from tokenmill.native import decode_step

    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", "64")  # read when the engine is built
    llm = LLM(str(path), **(dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
                                 enable_prefix_caching=False) | engine_kw))
    calls: list[int] = []
    real = decode_step.run
    monkeypatch.setattr(decode_step, "run", lambda model, step: (calls.append(int(step.M)), real(model, step)))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)

    def run() -> list[tuple[list[int], list[float]]]:
        outs = llm.generate(prompts, params)
        return [(list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in outs]

    monkeypatch.setenv(decode_step.ENV_SWITCH, "0")
    layers = run()
    assert not calls
    monkeypatch.delenv(decode_step.ENV_SWITCH)
    return llm, calls, layers, run()
