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
        llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=10**6))
    assert not llm.engine.has_unfinished_requests()


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
                     ({"prompt_token_ids": "1 2"}, "got the keys"), ([1, "2"], "not token ids"), (3.5, "float")):
        with pytest.raises(ParamError, match=why) as e:
            llm.generate(["Hello", bad], params)  # type: ignore[list-item]
        assert e.value.field == "prompt"
        assert not llm.engine.has_unfinished_requests()
