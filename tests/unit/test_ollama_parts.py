"""The Ollama front end's model-free parts: the Go template subset, the options mapping, FIM token lookup."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenmill.entrypoints.ollama.go_template import TemplateError, render, uses_field
from tokenmill.entrypoints.ollama.model_card import _fim_tokens, ollama_name, parameter_size
from tokenmill.entrypoints.ollama.options import OptionsMapper
from tokenmill.entrypoints.ollama.protocol import Options
from tokenmill.entrypoints.server.errors import APIError

MESSAGES = [{"Role": "system", "Content": "Be brief."}, {"Role": "user", "Content": "Hi"}]
VALUES = {"System": "Be brief.", "Prompt": "Hi", "Suffix": "", "Response": "", "Messages": MESSAGES}
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_legacy_template_stops_at_the_response() -> None:
    template = ("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
                "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
                "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
    assert render(template, VALUES) == CHATML
    assert render(template, {**VALUES, "System": ""}) == CHATML.split("<|im_end|>\n", 1)[1]


def test_messages_template_with_variables_and_functions() -> None:
    template = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|im_start|>{{ .Role }}
{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_end|>
<|im_start|>assistant
{{ end }}
{{- end }}"""
    assert render(template, VALUES) == CHATML


@pytest.mark.parametrize("template, expected", [
    ("{{/* a comment */}}A {{- 3 -}} B", "A3B"),
    ('{{ print 1 2 "x" }}', "1 2x"),  # Go's Sprint: spaces between non-strings only
    ("{{ with .Suffix }}S{{ else }}none{{ end }}", "none"),
    ("{{ range .Tools }}t{{ else }}no tools{{ end }}", "no tools"),
    ("{{ index .Messages 1 | json }}", '{"Role":"user","Content":"Hi"}'),
    ('{{ $x := 1 }}{{ if eq .Prompt "Hi" }}{{ $x = 2 }}{{ end }}{{ $x }}', "2"),
    ("{{ (index .Messages 0).Role }}", "system"),
    ('{{ if eq .Prompt "a" "Hi" }}match{{ else if .System }}sys{{ end }}', "match"),
    ("{{ if .Suffix }}s{{ else if .System }}sys{{ else }}none{{ end }}", "sys"),
    ('{{ "a}}b" }}', "a}}b"),
])
def test_template_features(template: str, expected: str) -> None:
    assert render(template, {**VALUES, "Tools": []}) == expected


@pytest.mark.parametrize("template, words", [
    ("{{ .Nope }}", "can't evaluate field Nope"), ('{{ printf "%s" .Prompt }}', "printf"),
    ("{{ if .Prompt }}x", "has no {{ end }}"), ("{{ end }}", "unexpected {{ end }}"),
    ('{{ template "x" }}', "template"), ("{{ .Prompt", "unclosed action"),
    ("{{ range .Prompt }}x{{ end }}", "can't iterate over a string"), ("{{ len 3 }}", "len"),
    ("{{ $y }}", "undefined variable $y"), ("{{ .Prompt .System }}", "only a function takes arguments"),
])
def test_template_errors(template: str, words: str) -> None:
    with pytest.raises(TemplateError, match=None) as e:
        render(template, VALUES)
    assert words in str(e.value)


def test_template_work_is_bounded() -> None:
    nested = "{{ range $.Messages }}" * 40 + "x" + "{{ end }}" * 40  # 2**40 x's, were it run
    with pytest.raises(TemplateError, match="steps"):
        render(nested, VALUES)
    with pytest.raises(TemplateError, match="characters"):
        render("{{ range .Messages }}{{ $.Prompt }}{{ end }}", {**VALUES, "Prompt": "y" * 3_000_000})


def test_uses_field() -> None:
    assert uses_field("<PRE>{{ .Prompt }}<SUF>{{ .Suffix }}<MID>", "Suffix")
    assert not uses_field("{{ .Prompt }}{{ .SuffixLike }}", "Suffix")


def test_options_map_to_sampling_params() -> None:
    mapper = OptionsMapper(max_model_len=2048, vocab_size=1000)
    default = mapper.map(None)
    p = default.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.repetition_penalty) == (0.8, 40, 0.9, 0.0, None, 1.0)
    assert (default.num_ctx, default.num_predict, p.max_tokens) == (2048, None, None)
    o = mapper.map(Options(temperature=0, top_k=5000, top_p=0.5, min_p=0.1, seed=3, stop=["\n"], num_predict=7,
                           num_ctx=512, repeat_penalty=1.3, repeat_last_n=512, presence_penalty=0.5,
                           frequency_penalty=0.25), logprobs=2)
    p = o.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.stop_strings) == (0.0, 1000, 0.5, 0.1, 3, ["\n"])
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.logprobs) == (1.3, 0.5, 0.25, 2)
    assert (o.num_ctx, o.num_predict, p.penalty_window) == (512, 7, 512)
    assert mapper.map(Options(repeat_penalty=1.1)).params.penalty_window == 64  # Ollama's default window
    assert mapper.map(Options(repeat_penalty=1.1, repeat_last_n=-1)).params.penalty_window is None
    assert mapper.map(Options(seed=-1, top_k=0, num_predict=-2)).params.seed is None
    off = mapper.map(Options(repeat_last_n=0, repeat_penalty=1.5, presence_penalty=1.0)).params
    assert (off.repetition_penalty, off.presence_penalty) == (1.0, 0.0)  # llama.cpp: window 0 turns them off
    # as Ollama's runners and sampler take them: num_ctx past the server's clamped to it, num_predict 0 or below
    # unbounded, temperature below 0 greedy, top_p outside (0, 1) off
    lenient = mapper.map(Options(num_ctx=32768, num_predict=0, temperature=-1, top_p=0.0))
    assert (lenient.num_ctx, lenient.num_predict) == (2048, None)
    assert (lenient.params.temperature, lenient.params.top_p) == (0.0, 1.0)
    assert mapper.map(Options(num_predict=-3, top_p=1.5)).num_predict is None
    assert mapper.map(Options(top_p=1.5)).params.top_p == 1.0
    for bad in (Options(num_ctx=0), Options(repeat_penalty=1.1, repeat_last_n=-2), Options(top_k=5, min_p=2.0),
                Options(typical_p=0.5), Options(penalize_newline=False)):
        with pytest.raises(APIError) as e:
            mapper.map(bad)
        assert e.value.status == 400 and e.value.param and e.value.param.startswith("options.")


def test_names_and_fim_tokens() -> None:
    assert ollama_name("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct:latest"
    assert ollama_name("qwen2.5:0.5b") == "qwen2.5:0.5b" and ollama_name("host:5000/m") == "host:5000/m:latest"
    assert (parameter_size(134_515_008), parameter_size(7_615_616_512)) == ("134.52M", "7.6B")
    vocab = {"<|fim_prefix|>": 10, "<|fim_suffix|>": 11, "<|fim_middle|>": 12}
    engine = SimpleNamespace(tokenizer=SimpleNamespace(token_to_id=vocab.get))
    assert _fim_tokens({}, engine) == (10, 11, 12)  # type: ignore[arg-type]
    keys = {"tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.fim_suf_token_id": 2,
            "tokenizer.ggml.fim_mid_token_id": 3}
    assert _fim_tokens(keys, engine) == (1, 2, 3)  # type: ignore[arg-type]
    no_fim = SimpleNamespace(tokenizer=SimpleNamespace(token_to_id={}.get))
    assert _fim_tokens({}, no_fim) is None  # type: ignore[arg-type]
