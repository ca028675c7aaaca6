"""Chat templates for GGUF files that carry none, by GGUF architecture.

Some GGUF conversions drop `tokenizer.chat_template` (the Gemma 3 270M file tokenmill tests with has
none), so a chat request would have no template. For such an architecture the model's own template, as
its maker publishes it in the HF tokenizer_config.json, is used instead; the loader logs that it did.
"""

from __future__ import annotations

# Google's Gemma 3 template (tokenizer_config.json of the gemma-3 checkpoints): a system message becomes a
# prefix of the first user turn; "assistant" turns are "model" turns.
GEMMA3_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Gemma 2 has the same turns (its own template refuses a system message; this one folds it into the first turn)
_BY_GGUF_ARCHITECTURE = {"gemma3": GEMMA3_CHAT_TEMPLATE, "gemma2": GEMMA3_CHAT_TEMPLATE}


def builtin_chat_template(gguf_architecture: str) -> str | None:
    """The template to use for a GGUF of this architecture that has none; None if there is no default."""
    return _BY_GGUF_ARCHITECTURE.get(gguf_architecture)
