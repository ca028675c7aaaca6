"""Harmony (gpt-oss's format, openai/harmony.py) read from recorded-style answers written here: where each
message's text goes (reasoning, content, tool calls), the answers cut short or malformed, and a stream fed in
every split (two pieces at every position, a character at a time, token-sized pieces) joining to exactly
the whole answer without a marker in any piece. Then what decides it is on: the template, the flags, the
end tokens of a harmony vocabulary (HF and GGUF), the history handed to the template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_tool_parsers import token_pieces

from tokenmill.entrypoints.openai.harmony import (MARKERS, HarmonyAnswer, HarmonyCall, HarmonyStream, Specials,
                                                  harmony_history, harmony_tools, is_harmony_template, parse,
                                                  uses_harmony)

OFFERED = ("get_weather", "get_time")


def accept(name: str, arguments: Any) -> bool:
    return name in OFFERED


def weather(city: str = "Paris") -> HarmonyCall:
    return HarmonyCall("get_weather", json.dumps({"city": city}))


A = "<|start|>assistant"
# (the answer as generated after the prompt's `<|start|>assistant`, reasoning, content, calls)
CASES: list[tuple[str, str | None, str, list[HarmonyCall]]] = [
    ("<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>" + A + "<|channel|>final<|message|>2 + 2 = 4.",
     "User asks 2+2. Answer 4.", "2 + 2 = 4.", []),
    ("<|channel|>final<|message|>Hello!", None, "Hello!", []),  # straight to the answer
    # the end tokens, when they are text (ignore_eos, or a decode that kept them): a message's end
    ("<|channel|>analysis<|message|>Hm.<|end|>" + A + "<|channel|>final<|message|>Hi.<|return|>", "Hm.", "Hi.", []),
    # calls: the recipient after the channel, with <|constrain|>json
    ('<|channel|>analysis<|message|>Need weather.<|end|>' + A + '<|channel|>commentary to=functions.get_weather '
     '<|constrain|>json<|message|>{"city":"Paris"}', "Need weather.", "", [weather()]),
    # ... before the channel, with a plain " json"
    ('<|channel|>analysis<|message|>Need weather.<|end|>' + A + ' to=functions.get_weather<|channel|>commentary '
     'json<|message|>{"city": "Paris"}<|call|>', "Need weather.", "", [weather()]),
    # a preamble (commentary to no one) is content
    ('<|channel|>commentary<|message|>Let me check.<|end|>' + A + '<|channel|>commentary to=functions.get_weather '
     '<|constrain|>json<|message|>{"city":"Paris"}', None, "Let me check.", [weather()]),
    # a function without arguments may write none
    ("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>", None, "",
     [HarmonyCall("get_time", "{}")]),
    # two calls (the first's <|call|> kept as text)
    ('<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>' + A + '<|channel|>'
     'commentary to=functions.get_time<|message|>{"timezone": "CET"}', None, "",
     [weather(), HarmonyCall("get_time", '{"timezone": "CET"}')]),
    ("<|channel|>analysis<|message|>One.<|end|>" + A + "<|channel|>analysis<|message|>Two.<|end|>" + A +
     "<|channel|>final<|message|>Three.", "One.\nTwo.", "Three.", []),  # messages of a kind: joined by a newline
    # cut off by max_tokens: in the reasoning, in a header, in a call's arguments
    ("<|channel|>analysis<|message|>The user wants", "The user wants", "", []),
    ("<|channel|>analysis<|message|>Done thinking.<|end|>" + A + "<|channel|>fin", "Done thinking.", "", []),
    ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa', None,
     '{"city": "Pa', []),
    # no header at all (the model skipped it, or a constrained answer), text after the last message, whitespace
    ("The capital of France is Paris.", None, "The capital of France is Paris.", []),
    ("  Paris is lovely.\n", None, "  Paris is lovely.\n", []),
    ("<|channel|>analysis<|message|>Think.<|end|>Four!", "Think.", "Four!", []),
    ("<|channel|>final<|message|>Four.<|end|>\n", None, "Four.", []),
    ("\n<|channel|>final<|message|>Four.", None, "Four.", []),
    ("", None, "", []),
    # not calls: a function not offered, arguments that are not a JSON object, another recipient
    ('<|channel|>commentary to=functions.send_mail <|constrain|>json<|message|>{"to": "x"}', None, '{"to": "x"}', []),
    ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris", None, "Paris", []),
    ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[1, 2]", None, "[1, 2]", []),
    ("<|channel|>analysis to=python code<|message|>print(2 + 2)", "print(2 + 2)", "", []),  # text of its channel
    # stray markers never show
    ("<|channel|>final<|message|>Four<|constrain|>.<|message|>", None, "Four.", []),
    ("<|channel|>final<|message|>Use <tags> and | pipes, even <| and |>.", None,
     "Use <tags> and | pipes, even <| and |>.", []),
    ('<|channel|>final<|message|>{"a": "<|"}', None, '{"a": "<|"}', []),
]


def feed(stream: HarmonyStream, pieces: list[str]) -> HarmonyAnswer:
    """The answer a stream builds from `pieces` (the last fed as final), no piece showing a marker."""
    reasoning, content, calls = "", "", []
    for k, piece in enumerate(pieces):
        news = stream.feed(piece, is_final=k == len(pieces) - 1)
        for text in (news.reasoning, news.content):
            assert not any(m in text for m in MARKERS), (pieces, text)
        reasoning += news.reasoning
        content += news.content
        calls += news.tool_calls
    return HarmonyAnswer(reasoning or None, content, calls)


@pytest.mark.parametrize("text, reasoning, content, calls", CASES)
def test_parse(text: str, reasoning: str | None, content: str, calls: list[HarmonyCall]) -> None:
    assert parse(text, accept) == HarmonyAnswer(reasoning, content, calls)


@pytest.mark.parametrize("text, reasoning, content, calls", CASES)
def test_a_stream_joins_to_the_whole_in_every_split(text: str, reasoning: str | None, content: str,
                                                    calls: list[HarmonyCall]) -> None:
    expected = parse(text, accept)
    for k in range(len(text) + 1):
        assert feed(HarmonyStream(accept), [text[:k], text[k:]]) == expected, k
    assert feed(HarmonyStream(accept), [*text, ""]) == expected  # a character at a time
    for seed in range(3):
        assert feed(HarmonyStream(accept), token_pieces(text, seed)) == expected


def test_text_streams_as_it_comes_and_a_marker_waits_until_whole() -> None:
    stream = HarmonyStream(accept)
    assert stream.feed("<|chan").reasoning == ""
    assert stream.feed("nel|>analysis<|message|>The user").reasoning == "The user"
    assert stream.feed(" asks<|e").reasoning == " asks"  # "<|e" may start <|end|>: held
    news = stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Four")
    assert (news.reasoning, news.content) == ("", "Four")
    news = stream.feed('<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"ci')
    assert not news.content and not news.tool_calls  # a call is reported whole, at its end
    news = stream.feed('ty": "Paris"}', is_final=True)
    assert news.tool_calls == [weather()] and stream.num_calls == 1


def test_the_request_decides_which_calls_are_calls() -> None:
    text = ('<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>' + A +
            '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"}')
    assert parse(text, accept).tool_calls == [weather(), weather("Oslo")]
    # parallel_tool_calls false: the first; the later one is text of its channel
    assert parse(text, accept, max_calls=1) == HarmonyAnswer(None, '{"city": "Oslo"}', [weather()])
    # no tools (or tool_choice none): no calls
    assert parse(text) == HarmonyAnswer(None, '{"city": "Paris"}\n{"city": "Oslo"}', [])
    # a strict tool's check (ToolCalling.accepts) sees the decoded arguments
    assert parse(text, lambda name, arguments: arguments["city"] == "Oslo").tool_calls == [weather("Oslo")]


def test_other_special_tokens_are_dropped_only_when_asked() -> None:
    hiding = Specials(["<|im_start|>", "<|endoftext|>", "<|reserved_200000|>", "<|channel|>"])
    text = ("<|channel|>analysis<|message|>Hm<|im_start|>.<|end|>" + A +
            "<|channel|>final<|message|>Four<|endoftext|>!")
    expected = HarmonyAnswer("Hm.", "Four!", [])
    assert parse(text, specials=hiding) == expected
    for k in range(len(text) + 1):
        assert feed(HarmonyStream(specials=hiding), [text[:k], text[k:]]) == expected, k
    assert parse(text) == HarmonyAnswer("Hm<|im_start|>.", "Four<|endoftext|>!", [])
    # a special text that is the start of a longer one waits for the rest
    longer = Specials(["<|x|>", "<|x|>y"])
    for k in range(len("<|x|>yz") + 1):
        assert feed(HarmonyStream(specials=longer), ["<|x|>yz"[:k], "<|x|>yz"[k:]]) == HarmonyAnswer(None, "z", [])


def test_which_models_speak_harmony() -> None:
    template = "{% for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>{% endfor %}"
    assert is_harmony_template(template) and not is_harmony_template("<|im_start|>") and not is_harmony_template(None)
    assert uses_harmony(template, None, "auto")
    assert uses_harmony("<|im_start|>", "openai_gptoss", "auto") and uses_harmony(None, None, "openai")
    assert not uses_harmony("<|im_start|>", "deepseek_r1", "hermes")


def test_a_call_turn_sent_back_with_a_preamble_renders() -> None:
    call = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need it.", "tool_calls": call},
               {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."}]
    out = harmony_history(history)
    assert out[1] == {"role": "assistant", "content": "", "reasoning_content": "Need it.\nLet me check.",
                      "tool_calls": call}
    assert out[0] == history[0] and out[2] == history[2] and history[1]["content"] == "Let me check."


def test_a_turn_with_two_calls_becomes_one_message_per_call_each_before_its_result() -> None:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": {}}}
             for i, n in enumerate(("get_weather", "get_time"))]
    history = [{"role": "user", "content": "Weather and time?"},
               {"role": "assistant", "content": "", "reasoning_content": "Both.", "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c1", "content": "noon"},
               {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
    out = harmony_history(history)
    assert [(m["role"], m.get("tool_calls", [{}])[0].get("id"), m.get("tool_call_id")) for m in out] == [
        ("user", None, None), ("assistant", "c0", None), ("tool", None, "c0"), ("assistant", "c1", None),
        ("tool", None, "c1")]
    assert out[1]["reasoning_content"] == "Both." and "reasoning_content" not in out[3]


def test_tools_the_gpt_oss_template_could_not_render_are_completed() -> None:
    """gpt-oss's template writes "// " + description and ", // default: " + default for enum parameters: a
    tool without a description, or an integer default, made it fail; rendered now, the schema otherwise kept."""
    from tokenmill.tokenizer.chat_template import ChatTemplateError, render_chat_template

    template = ("{% for t in tools %}{{ '// ' + t.function.description }}\n{% for n, p in "
                "t.function.parameters.properties.items() %}{{ n }}: {{ p.enum | join(' | ') }}"
                "{{ ', // default: ' + p.default }}{% endfor %}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "enum": [1, 2], "default": 1}}}}}]
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, [], tools=tools)
    fixed = harmony_tools(tools)
    assert render_chat_template(template, [], tools=fixed) == "// \nn: 1 | 2, // default: 1"
    assert fixed is not None and fixed[0]["function"]["parameters"]["properties"]["n"]["enum"] == [1, 2]
    assert "description" not in tools[0]["function"] and tools[0]["function"]["parameters"]["properties"]["n"][
        "default"] == 1  # the request's own tools untouched


def test_a_call_cut_at_max_tokens_is_no_call() -> None:
    """An answer that ended at max_tokens inside a call message never wrote its <|call|>: no call (with an empty
    body it would read as a call without arguments)."""
    text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert parse(text, accept).tool_calls == [HarmonyCall("get_weather", "{}")]
    cut = parse(text, accept, cut=True)
    assert cut.tool_calls == [] and cut.content == ""
    pieces = token_pieces(text, 3)
    stream = HarmonyStream(accept)
    news = [stream.feed(p, i == len(pieces) - 1, cut=True) for i, p in enumerate(pieces)]
    assert not any(n.tool_calls for n in news)


# -- the end of a harmony answer ---------------------------------------------------------------------------
def test_an_hf_harmony_vocabulary_ends_at_return_and_call_not_end(tmp_path: Path) -> None:
    """<|end|> ends a message, not the answer; <|return|> and <|call|> end it (both, whichever the configs
    name), as llama.cpp reads a gpt-oss vocabulary."""
    from tokenizers import AddedToken, Tokenizer as Backend, models

    from tokenmill.tokenizer.tokenizer import Tokenizer

    backend = Backend(models.WordLevel({"a": 0}, unk_token="a"))
    backend.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|return|>"}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    ids = {m: tok.token_to_id(m) for m in MARKERS}
    assert {ids["<|return|>"], ids["<|call|>"]} <= tok.eog_token_ids and ids["<|end|>"] not in tok.eog_token_ids
    # a model whose configs name <|end|> as an end token keeps it
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|return|>"], ids["<|end|>"]]}))
    assert ids["<|end|>"] in Tokenizer.from_hf_dir(tmp_path).eog_token_ids


def test_a_gguf_harmony_vocabulary_ends_at_return_and_call_not_end() -> None:
    """gpt-oss GGUFs name <|return|> as tokenizer.ggml.eos_token_id; <|call|> ends the answer too."""
    from tokenmill.tokenizer.gguf_vocab import GGUFVocab

    tokens = ["a", "b", "<|endoftext|>", *MARKERS]
    types = [1, 1, 3, 3, 3, 3, 3, 3, 3, 3]
    vocab = GGUFVocab.from_metadata({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                                     "tokenizer.ggml.eos_token_id": tokens.index("<|return|>")})
    assert {tokens[i] for i in vocab.eog_ids} == {"<|endoftext|>", "<|return|>", "<|call|>"}
