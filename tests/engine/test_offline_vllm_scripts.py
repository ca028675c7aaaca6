"""vLLM batch scripts ported to tokenmill's offline API (`from tokenmill import LLM, SamplingParams`): what such
scripts do on their first lines and in their loops works as it does in vLLM, or fails naming why.

One small engine (the default model, fp32, a 512-token context) serves every test."""

from __future__ import annotations

import threading

import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.outputs import FinishReason
from tokenmill.sampling_params import ParamError


@pytest.fixture(scope="module")
def llm() -> LLM:
    # vLLM's usual first line, with the arguments that change nothing on one CPU device
    return LLM(model="default", dtype=torch.float32, max_model_len=512, kv_cache_memory="64MiB", progress=False,
               enforce_eager=True, tensor_parallel_size=1, trust_remote_code=True, tokenizer="default")


def test_constructor_arguments_vllm_scripts_pass() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size=2: tokenmill runs a model on one device"):
        LLM(tensor_parallel_size=2, progress=False)
    with pytest.raises(ValueError, match="another is not supported"):
        LLM(tokenizer="some/other-tokenizer", progress=False)


def test_max_tokens_past_the_context_ends_there_and_spares_the_batch(llm: LLM) -> None:
    """vLLM's LLM: a long prompt whose max_tokens would pass max_model_len is cut at the context's end
    (finish_reason length); the other prompts of the batch run as asked."""
    long = "word " * 490
    n_long = len(llm.get_tokenizer().encode(long))
    short, cut = llm.generate(["Hi", long], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
                              use_tqdm=False)
    assert len(short.outputs[0].token_ids) == 32
    assert len(cut.outputs[0].token_ids) == 512 - n_long and cut.outputs[0].finish_reason == FinishReason.LENGTH
    assert f"{cut.outputs[0].finish_reason}" == "length" and str(cut.outputs[0].finish_reason) == "length"
    with pytest.raises(ParamError, match="maximum context length is 512"):  # a prompt that fills it still fails
        llm.generate(["word " * 600], SamplingParams(max_tokens=4), use_tqdm=False)


def test_two_threads_generating_at_once(llm: LLM) -> None:
    """Calls from two threads run one after the other (the engine is not thread-safe): both get their
    answers, the same as each alone."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = {k: [f"Thread {k} prompt {i}:" for i in range(4)] for k in range(2)}
    alone = {k: [o.outputs[0].token_ids for o in llm.generate(p, params, use_tqdm=False)] for k, p in prompts.items()}
    got: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            got[k] = [o.outputs[0].token_ids for o in llm.generate(prompts[k], params, use_tqdm=False)]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and got == alone
    assert not llm.engine.has_unfinished_requests()


def test_chat_takes_text_parts_and_refuses_others(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=8)
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]}],
                     params, use_tqdm=False)
    plain = llm.chat([{"role": "user", "content": "What is\n2+2?"}], params, use_tqdm=False)
    assert parts[0].prompt_token_ids == plain[0].prompt_token_ids and parts[0].outputs[0].text == plain[0].outputs[0].text
    with pytest.raises(ParamError, match="only text content parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], params)
    with pytest.raises(ParamError, match="LoRA adapters are not supported"):
        llm.generate(["Hi"], params, lora_request=object())


def test_logprobs_read_as_vllm_reads_them(llm: LLM) -> None:
    """Each position's entry is a dict of token id -> Logprob (len, iteration, get, items) whose Logprobs carry
    decoded_token; the output's num_cached_tokens is there."""
    tok = llm.get_tokenizer()
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                                                     prompt_logprobs=2), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.logprobs is not None and len(c.logprobs) == 4
    for tid, entry in zip(c.token_ids, c.logprobs):
        assert len(entry) in (3, 4) and tid in list(entry) and entry.get(tid) is entry[tid]
        assert entry.get(-1) is None
        for k, lp in entry.items():
            assert lp.decoded_token == tok.decode([k], skip_special_tokens=False)
        assert entry[tid].rank == 1  # greedy: the sampled token is the most likely
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert all(lp.decoded_token is not None for e in out.prompt_logprobs[1:] for lp in e.values())  # type: ignore[union-attr]
    assert out.num_cached_tokens == 0


def test_sampling_params_types_and_vllm_fields(llm: LLM) -> None:
    for kw, field in ((dict(top_k=1.5), "top_k"), (dict(max_tokens=5.0), "max_tokens"), (dict(n="2"), "n"),
                      (dict(temperature="hot"), "temperature"), (dict(allowed_token_ids=[]), "allowed_token_ids")):
        with pytest.raises(ParamError) as e:
            SamplingParams(**kw)  # type: ignore[arg-type]
        assert e.value.field == field
    assert SamplingParams(logit_bias={"5": 1.0}).logit_bias == {5: 1.0}  # as JSON writes the keys
    tok = llm.get_tokenizer()
    allowed = [tok.encode(w, add_special_tokens=False)[0] for w in (" blue", " green")]
    out = llm.generate(["My favourite colour is"], SamplingParams(temperature=1.0, seed=0, max_tokens=6,
                                                                   allowed_token_ids=allowed), use_tqdm=False)[0]
    assert set(out.outputs[0].token_ids) <= set(allowed)


def test_tokenizer_as_scripts_use_it(llm: LLM) -> None:
    """get_tokenizer(): apply_chat_template(tokenize=True) gives ids generate takes as prompt_token_ids; the
    HF names scripts call (len, convert_ids_to_tokens, batch_decode, get_vocab)."""
    tok = llm.get_tokenizer()
    msgs = [{"role": "user", "content": "Say hi."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert isinstance(ids, list) and ids == tok.encode(text, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=4)
    assert (llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0].token_ids
            == llm.chat(msgs, params, use_tqdm=False)[0].outputs[0].token_ids)
    with pytest.raises(ParamError, match="prompt_token_ids must be a list of token ids, got str"):
        llm.generate({"prompt_token_ids": text}, params)
    assert len(tok) == tok.vocab_size and tok.get_vocab()[tok.convert_ids_to_tokens(ids[0])] == ids[0]
    assert tok.batch_decode([ids[:3], ids[3:6]]) == [tok.decode(ids[:3]), tok.decode(ids[3:6])]
