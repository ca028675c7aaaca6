"""Sandboxed rendering of Hugging Face style Jinja chat templates.

The renderer aims to produce exactly what ``transformers``' ``apply_chat_template(..., tokenize=False)``
produces for the same template and inputs: the same Jinja environment options (``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension and a no-op ``{% generation %}`` block), the same extra
names (``raise_exception``, ``strftime_now``, a JSON ``tojson`` filter that does not HTML-escape, a
restricted ``dict`` and ``namespace``) and the same preprocessing of the messages (``None`` values dropped,
reasoning fields aliased, everything rebuilt from plain JSON types).

Chat templates come from model files and are untrusted code. They run in Jinja's
``ImmutableSandboxedEnvironment``, and this module makes the sandbox strict: any access to an attribute
the sandbox considers unsafe (dunder/private names, function internals, ``str.format`` tricks) raises
immediately instead of quietly rendering as an empty string, and ``*``/``**`` are size-limited so a
template cannot exhaust memory. Every failure surfaces as :class:`ChatTemplateError`.

Message contents are passed as data only; they are never compiled as templates.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "ChatTemplateSecurityError", "render_chat_template", "compile_chat_template"]

# Upper bounds on what ``*`` and ``**`` may build inside a template (characters / list items, exponent).
_MAX_SEQUENCE_PRODUCT = 10_000_000
_MAX_POWER_EXPONENT = 1_000
# Names a message's reasoning may be given under; the first is the one templates usually read.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template failed to compile or render, called ``raise_exception``, or tried to leave the sandbox."""


class ChatTemplateSecurityError(ChatTemplateError):
    """The chat template tried to leave the sandbox (or to exhaust memory): the template is at fault, not the
    conversation, and nothing it attempted ran."""


class _TemplateRaised(TemplateError):
    """Internal: carries the message of a template's own ``raise_exception(...)`` call."""


class _GenerationBlock(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` (used by HF templates to mark assistant text) and
    renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: Callable[[], str]) -> str:
        return caller()


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox in which touching an unsafe attribute is an immediate error.

    Jinja's stock sandbox returns an "undefined" object for unsafe attributes, which renders as an empty
    string and only fails when used further. Raising at once makes every escape attempt loud.
    """

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:  # type: ignore[override]
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed in a chat template"
        )

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and not isinstance(count, bool):
                    if len(seq) * max(count, 0) > _MAX_SEQUENCE_PRODUCT:
                        raise SecurityError("chat template tried to build an oversized sequence")
            return operator.mul(left, right)
        if operator_name == "**":
            if isinstance(right, (int, float)) and not isinstance(right, bool) and abs(right) > _MAX_POWER_EXPONENT:
                raise SecurityError("chat template used an oversized exponent")
            return operator.pow(left, right)
        return super().call_binop(context, operator_name, left, right)


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` for templates; refuses underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same calling convention as jinja2's Namespace
        self, rest = args[0], args[1:]
        values = dict(*rest, **kwargs)
        for key in values:
            _SafeNamespace._check(key)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates may not set underscore-prefixed namespace attributes ({name!r})")


class _DictFactory:
    """The ``dict`` global: builds dicts without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: Any) -> NoReturn:
    raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Plain json.dumps, like transformers: no HTML escaping, non-ASCII kept, optional indent.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _make_environment() -> _StrictSandbox:
    env = _StrictSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _SafeNamespace
    return env


_ENV = _make_environment()


def load_chat_template(value: str) -> str:
    """`--chat-template` as vLLM reads it: the path of a Jinja file, or the template text itself. The
    template is compiled here, so a bad one fails at start with the reason (ValueError), not on the first
    chat request."""
    from pathlib import Path

    path = Path(value).expanduser()
    looks_like_template = "{{" in value or "{%" in value
    if not looks_like_template and path.is_file():
        text = path.read_text(encoding="utf-8")
    elif looks_like_template:
        text = value
    else:
        raise ValueError(f"--chat-template {value!r} is neither a readable file nor a Jinja template "
                         "(no {{ ... }} or {% ... %} in it)")
    try:
        compile_chat_template(text)
    except ChatTemplateError as e:
        raise ValueError(f"--chat-template does not compile: {e}") from None
    return text


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile ``template`` once (results are cached by template text).

    Raises:
        ChatTemplateError: the template is not valid Jinja.
    """
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string, not {type(template).__name__}")
    try:
        return _ENV.from_string(template)
    except TemplateError as exc:
        raise ChatTemplateError(f"invalid chat template: {exc}") from exc


def _plain(value: Any) -> Any:
    """Rebuild ``value`` from plain JSON-like types so a template never sees methods of arbitrary objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":  # numpy scalars
        return _plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic models
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: list[Any]) -> list[dict]:
    """Normalise messages the way transformers does before rendering."""
    prepared: list[dict] = []
    for message in messages:
        message = _plain(message)
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {type(message).__name__}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render_chat_template(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **extra: Any,
) -> str:
    """Render a chat template.

    Args:
        template: Jinja source of the chat template.
        messages: the conversation, a list of ``{"role": ..., "content": ...}`` dicts (other keys such as
            ``tool_calls`` are passed through).
        add_generation_prompt: ask the template to append the header that starts an assistant turn.
        continue_final_message: cut the text right after the final message's content, leaving that message
            open (no end-of-turn) for the model to continue; as transformers does. Not with
            ``add_generation_prompt``.
        tools: JSON schemas of the tools available to the model, or ``None``.
        documents: retrieval documents, or ``None``.
        bos_token / eos_token: special token strings exposed to the template (omitted when ``None``).
        **extra: any further variables for the template (e.g. ``enable_thinking``).

    Returns:
        The rendered prompt text.

    Raises:
        ChatTemplateError: the template is invalid, raised an exception itself, failed while rendering,
            or tried to access something outside the sandbox.
    """
    compiled = compile_chat_template(template)
    variables: dict[str, Any] = {}
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    variables.update(_plain(extra))
    variables["messages"] = _prepare_messages(list(messages))
    variables["tools"] = _plain(tools)
    variables["documents"] = _plain(documents)
    variables["add_generation_prompt"] = bool(add_generation_prompt)
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
    try:
        rendered = compiled.render(**variables)
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"chat template raised an error: {exc.message}") from None
    except SecurityError as exc:
        raise ChatTemplateSecurityError(f"chat template rejected by the sandbox: {exc}") from None
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template failed to render: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError,
            RecursionError, MemoryError) as exc:
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
    return _open_final_message(rendered, variables["messages"]) if continue_final_message else rendered


def _open_final_message(rendered: str, messages: list[dict]) -> str:
    """``rendered`` cut right after the final message's content (transformers' rule): at the last occurrence
    of the stripped content, keeping the content's trailing whitespace where the template kept it."""
    content = messages[-1].get("content") if messages else None
    if isinstance(content, list):  # content parts: the last text part is the one to continue
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        content = texts[-1] if texts else None
    if not isinstance(content, str) or not content.strip():
        raise ChatTemplateError("continue_final_message needs a final message with text to continue")
    start = rendered.rfind(content.strip())
    if start < 0:
        raise ChatTemplateError("continue_final_message: the final message does not appear in the rendered chat "
                                "(the chat template changes it), so it cannot be continued")
    kept = content.lstrip()
    end = start + (len(kept) if rendered.startswith(kept, start) else len(content.strip()))
    return rendered[:end]
