"""vLLM's chat template options over HTTP: `--chat-template` (a file or the text) replaces the model's, a
request's `chat_template_kwargs` reach the template (chat and /tokenize), and Ollama's `think: false` is
the template's enable_thinking false. Bad values are 400s naming the field; a bad template fails at start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgi_app import call, in_process_app

from tokenmill import LLM
from tokenmill.entrypoints.server.config import ServerConfig

# renders "[no thinking]" after the assistant header when enable_thinking is false, as Qwen3's does
TEMPLATE = ("{% for m in messages %}### {{ m.role }}\n{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}### assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}[no thinking]\n{% endif %}"
            "{% if reasoning_effort is defined %}[effort {{ reasoning_effort }}]\n{% endif %}{% endif %}")
CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    yield from in_process_app(ServerConfig(log_requests=False), max_model_len=256, kv_cache_memory=32 * 2**20,
                              dtype="float32", quantization="dequantize", chat_template=str(path))


def text_of(app: Any, body: dict[str, Any]) -> str:
    r = call(app, "POST", "/tokenize", body)
    assert r.status_code == 200, r.text
    return call(app, "POST", "/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]


def test_the_template_and_its_kwargs_render(app: Any) -> None:
    plain = text_of(app, {"messages": CHAT})
    assert plain.endswith("### assistant\n") and "[no thinking]" not in plain  # the file's template
    off = text_of(app, {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert off.endswith("### assistant\n[no thinking]\n")
    on = text_of(app, {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": True, "unused": [1, 2]}})
    assert on == plain
    # chat renders the same prompt as /tokenize
    body = {"messages": CHAT, "max_tokens": 1, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    r = call(app, "POST", "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    ids = call(app, "POST", "/tokenize", {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.json()["usage"]["prompt_tokens"] == ids.json()["count"]


def test_openai_fields_clients_send_by_default(app: Any) -> None:
    """OpenAI's reasoning_effort is the template variable of that name (chat_template_kwargs' own wins); store,
    metadata, service_tier, prompt_cache_key, safety_identifier and text-only modalities are accepted."""
    def prompt_tokens(**fields: Any) -> int:
        r = call(app, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "temperature": 0, **fields})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens"])

    def count(**kwargs: Any) -> int:
        return int(call(app, "POST", "/tokenize", {"messages": CHAT, "chat_template_kwargs": kwargs}).json()["count"])

    rendered = text_of(app, {"messages": CHAT, "chat_template_kwargs": {"reasoning_effort": "low"}})
    assert rendered.endswith("[effort low]\n")
    assert prompt_tokens(reasoning_effort="low") == count(reasoning_effort="low") > count()
    assert prompt_tokens(reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"}) == \
        count(reasoning_effort="high")
    assert prompt_tokens(store=False, metadata={"team": "a"}, service_tier="auto", prompt_cache_key="k",
                         safety_identifier="u1", modalities=["text"], user="u1") == count()


def test_ollama_think_false_turns_thinking_off(app: Any) -> None:
    r = call(app, "POST", "/api/chat", {"model": "SmolLM2-135M-Instruct", "messages": CHAT, "stream": False,
                                        "think": False, "options": {"num_predict": 1, "temperature": 0}})
    assert r.status_code == 200, r.text
    with_kwargs = call(app, "POST", "/tokenize", {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.json()["prompt_eval_count"] == with_kwargs.json()["count"]
    r = call(app, "POST", "/api/chat", {"model": "SmolLM2-135M-Instruct", "messages": CHAT, "stream": False,
                                        "think": True})
    assert r.status_code == 400 and "--reasoning-parser" in r.json()["error"]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"messages": []}, "messages cannot be set"),
    ({"add_generation_prompt": False}, "add_generation_prompt cannot be set"),
    ({"9lives": 1}, "identifiers"),
    (["enable_thinking"], ""),
])
def test_bad_kwargs_are_400s_naming_the_field(app: Any, kwargs: Any, words: str) -> None:
    for path, extra in (("/v1/chat/completions", {"max_tokens": 1}), ("/tokenize", {})):
        r = call(app, "POST", path, {"messages": CHAT, "chat_template_kwargs": kwargs, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "chat_template_kwargs" and words in err["message"], err
    r = call(app, "POST", "/tokenize", {"prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_a_bad_chat_template_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not compile"):
        LLM(progress=False, chat_template="{% for m in messages %}{{ m.content }}")
    with pytest.raises(ValueError, match="neither a readable file nor a Jinja template"):
        LLM(progress=False, chat_template=str(tmp_path / "missing.jinja"))
