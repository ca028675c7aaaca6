"""The offline API goes through the one input path: the same errors, naming the same fields, and a bad
prompt in a batch leaves nothing queued."""

from __future__ import annotations

from typing import Any

import pytest

from tokenmill import SamplingParams
from tokenmill.engine.input_processor import ContextLengthError, ParamError, ProcessedPrompt


def test_a_bad_prompt_in_a_batch_queues_nothing(llm: Any) -> None:
    with pytest.raises(ParamError, match="the prompt is empty") as e:
        llm.generate(["Hello", []], SamplingParams(max_tokens=2))
    assert e.value.field == "prompt"
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ParamError, match="is out of range") as e:
        llm.generate([[1, 2], [llm.tokenizer.vocab_size]], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()


def test_chat_is_checked_against_the_context(llm: Any) -> None:
    with pytest.raises(ContextLengthError, match="maximum context length is 2048 tokens"):
        llm.chat([{"role": "user", "content": "hi " * 2100}], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished_requests()
    # a max_tokens past the context is cut to what is left (vLLM's LLM), not refused
    processed = llm.engine.input_processor.process(llm.tokenizer.encode("hi"), SamplingParams(max_tokens=10**6),
                                                   cap_max_tokens=True)
    assert processed.max_tokens == 2048 - len(processed.prompt_token_ids)


def test_the_engine_takes_processed_prompts_as_they_are(llm: Any) -> None:
    params = SamplingParams(temperature=0, max_tokens=4)
    processed = llm.engine.input_processor.process("The capital of France is", params)
    assert isinstance(processed, ProcessedPrompt) and processed.max_tokens == 4
    from_text, from_processed = llm.generate(["The capital of France is", processed], params)
    assert from_text.outputs[0].token_ids == from_processed.outputs[0].token_ids
    assert from_processed.prompt == "The capital of France is"
    assert from_processed.prompt_token_ids == from_text.prompt_token_ids


def test_vllm_prompt_dicts_are_read_and_other_shapes_refused(llm: Any) -> None:
    """vLLM's TextPrompt and TokensPrompt dicts give what the text and the ids give; a dict with another key
    (e.g. multi_modal_data) or a list of non-ids is a ParamError on "prompt", with nothing queued."""
    params = SamplingParams(temperature=0, max_tokens=4)
    ids = llm.tokenizer.encode("The capital of France is")
    plain, text, tokens = llm.generate(["The capital of France is", {"prompt": "The capital of France is"},
                                        {"prompt_token_ids": ids}], params)
    assert plain.outputs[0].token_ids == text.outputs[0].token_ids == tokens.outputs[0].token_ids
    assert text.prompt == "The capital of France is" and tokens.prompt_token_ids == ids
    [alone] = llm.generate({"prompt_token_ids": ids}, params)  # one dict, not a list of them
    assert alone.outputs[0].token_ids == plain.outputs[0].token_ids
    for bad, why in (({"prompt": "hi", "multi_modal_data": {}}, "multi_modal_data"), ({}, "got the keys"),
                     ({"prompt_token_ids": "1 2"}, "prompt_token_ids must be a list of token ids, got str"), ([1, "2"], "not token ids"), (3.5, "float")):
        with pytest.raises(ParamError, match=why) as e:
            llm.generate(["Hello", bad], params)  # type: ignore[list-item]
        assert e.value.field == "prompt"
        assert not llm.engine.has_unfinished_requests()


def test_vllm_offline_signatures_and_chat_template_options(llm: Any) -> None:
    """vLLM's keyword names (generate(prompts, sampling_params=), chat(messages, sampling_params=)),
    get_tokenizer(), and chat's continue_final_message, chat_template and chat_template_kwargs."""
    params = SamplingParams(temperature=0, max_tokens=3)
    by_keyword = llm.generate(prompts=["The capital of France is"], sampling_params=params)[0]
    assert by_keyword.outputs[0].token_ids == llm.generate("The capital of France is", params)[0].outputs[0].token_ids
    tok = llm.get_tokenizer()
    assert tok.encode("hello") == llm.tokenizer.encode("hello")

    conv = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    cont = llm.chat(messages=conv, sampling_params=params, continue_final_message=True)[0]
    want = llm.engine.input_processor.render_chat(conv, False, continue_final_message=True)
    assert cont.prompt_token_ids == tok.encode(want) and want.rstrip().endswith("The colour is")
    with pytest.raises(ParamError, match="Cannot set both") as e:
        llm.chat(conv, params, continue_final_message=True, add_generation_prompt=True)
    assert e.value.field == "continue_final_message"

    # a template of our own that reads a variable: the kwargs reach it, and change the prompt
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
                "[no thinking]{% endif %}{% endif %}")
    user = [{"role": "user", "content": "hi"}]
    on, off = (llm.chat(user, params, chat_template=template, chat_template_kwargs=kw)[0]
               for kw in (None, {"enable_thinking": False}))
    assert on.prompt_token_ids == tok.encode("<user>hi<assistant>")
    assert off.prompt_token_ids == tok.encode("<user>hi<assistant>[no thinking]")
    for bad, match in (({"messages": []}, "messages cannot be set"), ({"not a name": 1}, "must be identifiers"),
                       (["enable_thinking"], "must be an object")):
        with pytest.raises(ParamError, match=match) as e:
            llm.chat(user, params, chat_template_kwargs=bad)  # type: ignore[arg-type]
        assert e.value.field == "chat_template_kwargs"
    assert not llm.engine.has_unfinished_requests()
