"""InputProcessor: the one input path. Render, tokenize, truncate and validate a prompt, once.

The offline `LLM`, `LLMEngine.add_request` and every server front end hand their prompts here; what comes
back is a ProcessedPrompt (plain data) that the engine trusts as it is, so a prompt the server already
checked is not checked again on the engine thread.

    text ----------------> tokenize --+
    token ids ------------------------+--> truncate_prompt_tokens --> validate --> ProcessedPrompt
    chat messages --> render template +       (keep the last N, or     (empty, ids in range,
                      --> tokenize            the first N: right)       SamplingParams, context)

Every rejection is a ParamError carrying the request field it blames (`prompt` by default; a caller may
name another, e.g. `messages` for chat), so front ends never parse error text. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenmill.sampling_params import ParamError, SamplingParams
from tokenmill.tokenizer.chat_template import ChatTemplateError, ChatTemplateSecurityError

if TYPE_CHECKING:
    from tokenmill.tokenizer.tokenizer import Tokenizer

__all__ = ["ContextLengthError", "InputProcessor", "ParamError", "ProcessedPrompt"]


class ContextLengthError(ParamError):
    """The prompt plus the requested output does not fit the context (vLLM's wording).

    It blames no single field (`field` is None): the prompt and max_tokens are at fault together."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


@dataclass(frozen=True)
class ProcessedPrompt:
    """A prompt ready for the engine: tokenized, truncated, and checked against its SamplingParams."""

    prompt: str | None  # the text, when the prompt was given as text (before truncation); else None
    prompt_token_ids: list[int]
    max_tokens: int  # resolved: the request's max_tokens, or the rest of the context when it had none


# the variables a render sets itself: a chat_template_kwargs entry may not replace them
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                         "continue_final_message", "bos_token", "eos_token", "chat_template",
                                         "raise_exception", "strftime_now"})


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """vLLM's chat_template_kwargs as a fresh dict of further template variables: an object of names that
    are not the render's own, or a ParamError naming chat_template_kwargs."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ParamError("chat_template_kwargs", f"must be an object, got {type(kwargs).__name__}")
    clash = sorted(k for k in kwargs if k in RESERVED_TEMPLATE_VARIABLES)
    if clash:
        raise ParamError("chat_template_kwargs", f"{', '.join(clash)} cannot be set here (the request's own fields "
                                                 "and the template's helpers set them)")
    bad = sorted(repr(k) for k in kwargs if not isinstance(k, str) or not k.isidentifier())
    if bad:
        raise ParamError("chat_template_kwargs", f"template variable names must be identifiers, got {', '.join(bad)}")
    return dict(kwargs)


class InputProcessor:
    """Turns prompts into ProcessedPrompts for one model: its tokenizer, vocabulary and context length."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    # -- the steps ---------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True, field: str = "prompt") -> list[int]:
        """Token ids of `text`. Text that is not Unicode (a lone surrogate: JSON's "\\ud800" escape without its
        pair) is a ParamError on `field`: the tokenizer cannot take it."""
        try:
            return self.tokenizer.encode(text, add_special_tokens)
        except (TypeError, UnicodeError):
            bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
            if bad is None:
                raise
            raise ParamError(field, f"the text is not valid Unicode: it holds a lone surrogate, U+{ord(text[bad]):04X} "
                                    "(a JSON \\u escape of half a pair?)") from None

    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a text prompt; a token-id prompt is copied as it is."""
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        return list(prompt)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, field: str = "messages", *,
                    continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                    template: str | None = None) -> str:
        """The chat template (`template`, else the model's) applied to `messages`; `continue_final_message`
        leaves the final message open; `template_kwargs` are further variables for the template (vLLM's
        chat_template_kwargs, e.g. {"enable_thinking": false}).

        A template that rejects the conversation (its `raise_exception`, a missing template) is a ParamError
        on `field`, a kwarg that would replace one of the render's own variables a ParamError on
        chat_template_kwargs; ChatTemplateSecurityError (the sandbox refused the template: the model's
        fault, not the request's) passes through as it is."""
        extra = check_template_kwargs(template_kwargs)
        if template is not None:
            extra["chat_template"] = template
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                      tools=tools, continue_final_message=continue_final_message,
                                                      **extra)
        except ChatTemplateSecurityError:
            raise
        except ChatTemplateError as e:
            raise ParamError(field, str(e)) from None

    def render_chat_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                        tools: list[dict[str, Any]] | None = None, field: str = "messages", *,
                        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                        template: str | None = None) -> list[int]:
        """`render_chat`, then tokenize."""
        return self.tokenize(self.render_chat(messages, add_generation_prompt, tools, field,
                                              continue_final_message=continue_final_message,
                                              template_kwargs=template_kwargs, template=template), field=field)

    @staticmethod
    def truncate(prompt_ids: list[int], params: SamplingParams) -> list[int]:
        """Keep only `truncate_prompt_tokens` tokens, when set: the last ones (truncation_side "left", the
        default) or the first ones ("right")."""
        num_kept = params.truncate_prompt_tokens
        if num_kept is None:
            return prompt_ids
        return prompt_ids[-num_kept:] if params.truncation_side == "left" else prompt_ids[:num_kept]

    def validate(self, prompt_ids: list[int], params: SamplingParams, field: str = "prompt",
                 cap_max_tokens: bool = False) -> int:
        """Check the prompt fits; returns the resolved max_tokens. Raises ParamError / ContextLengthError.
        `cap_max_tokens` (the offline API, as vLLM's LLM): a max_tokens past the context is cut to what is
        left (the output then ends with finish_reason length); the server refuses it, as vLLM's does."""
        V = self.vocab_size
        if not prompt_ids:
            raise ParamError(field, "the prompt is empty: give at least one token")
        bad = [t for t in prompt_ids if not 0 <= t < V]
        if bad:
            raise ParamError(field, f"prompt token id {bad[0]} is out of range [0, {V})")
        params.validate(V)
        n_prompt, limit = len(prompt_ids), self.max_model_len
        if params.max_tokens is None:
            if n_prompt >= limit:
                raise ContextLengthError(
                    f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                    f"{n_prompt} input tokens, which leaves no room for output tokens. Please reduce the length "
                    "of the input prompt.")
            return limit - n_prompt
        total = n_prompt + params.max_tokens
        if total > limit and cap_max_tokens and n_prompt < limit:
            return limit - n_prompt
        if total > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{params.max_tokens} output tokens and your prompt contains {n_prompt} input tokens, for a "
                f"total of {total} tokens. Please reduce the length of the input prompt or the number of "
                "requested output tokens.")
        return params.max_tokens

    # -- the whole path ----------------------------------------------------------------------------------
    def process(self, prompt: str | list[int] | ProcessedPrompt, params: SamplingParams,
                field: str = "prompt", cap_max_tokens: bool = False) -> ProcessedPrompt:
        """Tokenize (text), truncate and validate (`cap_max_tokens`: see validate). A ProcessedPrompt is
        returned as it is: it was made by this path for these params already."""
        if isinstance(prompt, ProcessedPrompt):
            return prompt
        prompt_ids = self.truncate(self.tokenize_prompt(prompt), params)
        max_tokens = self.validate(prompt_ids, params, field, cap_max_tokens)
        return ProcessedPrompt(prompt if isinstance(prompt, str) else None, prompt_ids, max_tokens)

    def process_chat(self, messages: list[dict[str, Any]], params: SamplingParams, add_generation_prompt: bool = True,
                     tools: list[dict[str, Any]] | None = None, field: str = "messages") -> ProcessedPrompt:
        """Render, tokenize, truncate and validate a conversation; errors blame `field`."""
        ids = self.render_chat_ids(messages, add_generation_prompt, tools, field)
        return self.process(ids, params, field)
