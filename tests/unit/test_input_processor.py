"""The one input path: tokenize, truncate, validate; every rejection names the field it blames."""

from __future__ import annotations

from typing import Any

import pytest

from tokenmill.engine.input_processor import ContextLengthError, InputProcessor, ParamError, ProcessedPrompt
from tokenmill.sampling_params import SamplingParams
from tokenmill.tokenizer.chat_template import ChatTemplateError, ChatTemplateSecurityError

VOCAB, CONTEXT = 100, 16


class FakeTokenizer:
    """One token per character (its code point mod VOCAB); a chat template that joins the contents."""

    def __init__(self, template_error: Exception | None = None) -> None:
        self.template_error = template_error

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) % VOCAB for c in text]

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: Any = None, continue_final_message: bool = False) -> str:
        if self.template_error is not None:
            raise self.template_error
        return "|".join(m["content"] for m in messages) + ("|" if add_generation_prompt else "")


def processor(tokenizer: Any = None) -> InputProcessor:
    return InputProcessor(tokenizer or FakeTokenizer(), VOCAB, CONTEXT)


def test_text_and_ids_become_processed_prompts() -> None:
    p = processor().process("abc", SamplingParams(max_tokens=4))
    assert p == ProcessedPrompt("abc", [1, 97, 98, 99], 4)
    p = processor().process([5, 6], SamplingParams(max_tokens=None))
    assert p == ProcessedPrompt(None, [5, 6], CONTEXT - 2)  # no max_tokens: the rest of the context


def test_a_processed_prompt_is_not_processed_again() -> None:
    p = ProcessedPrompt(None, [5], 3)
    assert processor().process(p, SamplingParams(max_tokens=1000)) is p


def test_truncation_keeps_the_last_tokens_before_the_checks() -> None:
    p = processor().process(list(range(40)), SamplingParams(max_tokens=4, truncate_prompt_tokens=5))
    assert p.prompt_token_ids == [35, 36, 37, 38, 39] and p.max_tokens == 4


def test_truncation_side_right_keeps_the_first_tokens() -> None:
    params = SamplingParams(max_tokens=4, truncate_prompt_tokens=5, truncation_side="right")
    assert processor().process(list(range(40)), params).prompt_token_ids == [0, 1, 2, 3, 4]
    with pytest.raises(ParamError, match="truncation_side must be 'left' or 'right'") as e:
        SamplingParams(truncate_prompt_tokens=5, truncation_side="middle")
    assert e.value.field == "truncation_side"


@pytest.mark.parametrize(("prompt", "params", "field", "message"), [
    ([], SamplingParams(), "prompt", "the prompt is empty"),
    ([1, VOCAB], SamplingParams(), "prompt", f"prompt token id {VOCAB} is out of range [0, {VOCAB})"),
    ([-1], SamplingParams(), "prompt", "prompt token id -1 is out of range"),
    ([1], SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias", f"token id {VOCAB} is out of range"),
    ([1], SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids", f"token id {VOCAB} is out of range"),
])
def test_rejections_name_their_field(prompt: list[int], params: SamplingParams, field: str, message: str) -> None:
    with pytest.raises(ParamError, match=message.replace("[", r"\[").replace(")", r"\)")) as e:
        processor().process(prompt, params)
    assert e.value.field == field and isinstance(e.value, ValueError)


def test_the_field_to_blame_can_be_chosen() -> None:
    with pytest.raises(ParamError) as e:
        processor().process([], SamplingParams(), field="messages")
    assert e.value.field == "messages"


def test_context_length_in_vllm_words() -> None:
    with pytest.raises(ContextLengthError) as e:
        processor().process(list(range(10)), SamplingParams(max_tokens=7))
    assert str(e.value) == (f"This model's maximum context length is {CONTEXT} tokens. However, you requested 7 "
                            f"output tokens and your prompt contains 10 input tokens, for a total of 17 tokens. "
                            "Please reduce the length of the input prompt or the number of requested output tokens.")
    assert e.value.field is None
    with pytest.raises(ContextLengthError, match="which leaves no room for output tokens"):
        processor().process(list(range(CONTEXT)), SamplingParams(max_tokens=None))
    assert processor().process(list(range(10)), SamplingParams(max_tokens=6)).max_tokens == 6  # exactly fits


def test_context_length_error_keeps_its_old_import_path() -> None:
    from tokenmill.engine import llm_engine

    assert llm_engine.ContextLengthError is ContextLengthError and issubclass(ContextLengthError, ParamError)


def test_sampling_params_errors_carry_their_field() -> None:
    with pytest.raises(ParamError, match="n must be between") as e:
        SamplingParams(n=0)
    assert e.value.field == "n"
    with pytest.raises(ParamError) as e:
        SamplingParams(max_tokens=2, min_tokens=3)
    assert e.value.field == "min_tokens"


def test_chat_is_rendered_then_processed() -> None:
    messages = [{"role": "user", "content": "hi"}]
    p = processor().process_chat(messages, SamplingParams(max_tokens=2))
    assert p.prompt is None and p.prompt_token_ids == FakeTokenizer().encode("hi|")


def test_a_template_rejecting_the_conversation_blames_messages() -> None:
    bad = processor(FakeTokenizer(ChatTemplateError("roles must alternate")))
    with pytest.raises(ParamError, match="roles must alternate") as e:
        bad.process_chat([{"role": "user", "content": "hi"}], SamplingParams())
    assert e.value.field == "messages"
    refused = processor(FakeTokenizer(ChatTemplateSecurityError("access to attribute")))
    with pytest.raises(ChatTemplateSecurityError):  # the model's fault, not the request's: passed on as it is
        refused.process_chat([{"role": "user", "content": "hi"}], SamplingParams())
