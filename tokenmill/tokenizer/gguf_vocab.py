"""A Hugging Face ``tokenizers`` backend from the vocabulary in GGUF metadata, as llama.cpp reads it.

A ``gpt2``-type vocabulary becomes a byte-level BPE whose pre-tokenizer reproduces llama.cpp's for the
file's ``tokenizer.ggml.pre`` value (pretokenizers.py), and a ``llama``-type (SentencePiece) vocabulary
becomes a byte-fallback BPE whose merges are ranked by the token scores, which is how llama.cpp's SPM
tokenizer merges. Control, user-defined and unknown tokens are added tokens, so they are recognised as
single tokens in input text (llama.cpp's "special token partition"); control and unknown tokens are
"special" and are skipped by ``decode(..., skip_special_tokens=True)``, user-defined ones are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers

from tokenmill.tokenizer.pretokenizers import ADD_BOS_PRE_TYPES, pre_tokenizer_spec

__all__ = ["EOG_TOKEN_TEXTS", "GGUFVocab", "build_gguf_backend"]

# GGUF token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Token texts llama.cpp treats as end-of-generation (when present in the vocabulary).
EOG_TOKEN_TEXTS: tuple[str, ...] = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
)
# Token texts llama.cpp auto-detects as EOT / EOM / fill-in-the-middle tokens; all of them are forced to
# "control" type, and the FIM pad / repo / file-separator ones also end generation.
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                  "<|code_prefix|>", "<|prefix|>")
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                  "<|code_suffix|>", "<|suffix|>")
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                  "<|code_middle|>", "<|middle|>")
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
# gpt-oss tokens llama.cpp always renders (forced to user-defined).
_FORCED_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

_SPM_SPACE = "\u2581"  # "▁", SentencePiece's escaped space


def _as_int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    return int(value)


@dataclass
class GGUFVocab:
    """The vocabulary part of GGUF metadata, with llama.cpp's token-attribute fix-ups applied."""

    tokens: list[str]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    eog_ids: set[int]

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> GGUFVocab:
        raw = md.get("tokenizer.ggml.tokens")
        if raw is None:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(raw)]
        n = len(tokens)
        raw_types = md.get("tokenizer.ggml.token_type")
        if raw_types is None:
            types = [_NORMAL] * n
        else:
            raw_types = raw_types[:n]
            types = [int(t) for t in (raw_types.tolist() if hasattr(raw_types, "tolist") else raw_types)]
        index = {t: i for i, t in enumerate(tokens)}

        def key_id(name: str) -> int | None:
            value = _as_int_or_none(md.get(f"tokenizer.ggml.{name}"))
            return value if value is not None and 0 <= value < n else None

        def present(texts: Iterable[str]) -> list[int]:
            return [index[t] for t in texts if t in index]

        def make_control(ids: Iterable[int]) -> None:
            for i in ids:
                if types[i] != _CONTROL:
                    types[i] = _CONTROL

        # Auto-detected special tokens are forced to control type, as llama.cpp does.
        eot = key_id("eot_token_id")
        eom = key_id("eom_token_id")
        fim_ids: dict[str, list[int]] = {}
        for name, texts in (("fim_pre", _FIM_PRE_TEXTS), ("fim_suf", _FIM_SUF_TEXTS), ("fim_mid", _FIM_MID_TEXTS),
                            ("fim_pad", _FIM_PAD_TEXTS), ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):
            given = key_id(f"{name}_token_id")
            found = [given] if given is not None else present(texts)
            if given is None:
                make_control(found)
            fim_ids[name] = found
        if eot is None:
            make_control(present(_EOT_TEXTS))
        if eom is None:
            make_control(present(_EOM_TEXTS))

        eog = set(fim_ids["fim_pad"]) | set(fim_ids["fim_rep"]) | set(fim_ids["fim_sep"])
        by_text = present(EOG_TOKEN_TEXTS)
        eog.update(by_text)
        make_control(by_text)
        for i in present(_FORCED_USER_DEFINED):
            types[i] = _USER_DEFINED

        bos = key_id("bos_token_id")
        eos = key_id("eos_token_id")
        for special in (eos, eot, eom):
            if special is not None:
                eog.add(special)

        # gpt-oss / solar-open: "<|end|>" ends a message but not the generation when these are present.
        texts_in_eog = {tokens[i] for i in eog}
        has_call = "<|call|>" in texts_in_eog or "<|calls|>" in texts_in_eog
        end_id = index.get("<|end|>")
        if end_id in eog and has_call and ("<|return|>" in texts_in_eog or "<|flush|>" in texts_in_eog):
            eog.discard(end_id)
            types[end_id] = _USER_DEFINED
        # Gemma 4 / PaddleOCR: "</s>" is not an end-of-generation token when "<|tool_response>" exists.
        s_id = index.get("</s>")
        if s_id in eog and "<|tool_response>" in texts_in_eog:
            eog.discard(s_id)
            types[s_id] = _NORMAL
        return cls(tokens=tokens, types=types, bos_id=bos, eos_id=eos, eog_ids=eog)

    def added_tokens(self) -> tuple[list[AddedToken], list[AddedToken]]:
        """Tokens matched as a whole in raw input text: (control and unknown tokens, which are special;
        user-defined tokens, which are not)."""
        special: list[AddedToken] = []
        plain: list[AddedToken] = []
        for text, ttype in zip(self.tokens, self.types):
            if ttype in (_CONTROL, _UNKNOWN, _USER_DEFINED):
                is_special = ttype != _USER_DEFINED
                token = AddedToken(text, special=is_special, normalized=False, lstrip=False, rstrip=False,
                                   single_word=False)
                (special if is_special else plain).append(token)
        return special, plain


def _bpe_merges(merges: Iterable[str], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """Parse GGUF merges ("left right", split at the first space after position 0); skip unusable ones."""
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut < 0:
            continue
        left, right = merge[:cut], merge[cut + 1:]
        if left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    return pairs


def _spm_merges(tokens: Sequence[str], types: Sequence[int], scores: Sequence[float] | None,
                vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """Merges for a SentencePiece vocabulary: every split of a token into two vocabulary tokens, ranked by
    the token's score (highest first), which is the order llama.cpp's SPM tokenizer merges in."""
    score_list = [float(s) for s in scores] if scores is not None else [0.0] * len(tokens)
    ranked: list[tuple[float, int, int, str, str]] = []
    for tid, piece in enumerate(tokens):
        if types[tid] == _BYTE or len(piece) < 2:
            continue
        score = score_list[tid]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, tid, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_gguf_backend(metadata: Mapping[str, Any]) -> tuple[tokenizers.Tokenizer, GGUFVocab, bool]:
    """(backend with its added tokens, the vocabulary, whether the file's type adds BOS by default).

    Raises:
        NotImplementedError: the vocabulary type (``tokenizer.ggml.model``) is not supported.
    """
    model_type = metadata.get("tokenizer.ggml.model")
    vocab = GGUFVocab.from_metadata(metadata)
    index = {t: i for i, t in enumerate(vocab.tokens)}
    if model_type == "gpt2":
        backend, default_add_bos = _bpe_backend(metadata, vocab, index)
    elif model_type == "llama":
        backend, default_add_bos = _spm_backend(metadata, vocab, index), True
    else:
        raise NotImplementedError(
            f"GGUF tokenizer type {model_type!r} is not supported (supported: 'gpt2' byte-level BPE and "
            "'llama' SentencePiece)")
    special, plain = vocab.added_tokens()
    backend.add_special_tokens(special)
    backend.add_tokens(plain)
    return backend, vocab, default_add_bos


def _bpe_backend(md: Mapping[str, Any], vocab: GGUFVocab, index: dict[str, int]) -> tuple[tokenizers.Tokenizer, bool]:
    merges = md.get("tokenizer.ggml.merges")
    if merges is None:
        raise NotImplementedError("GGUF BPE vocabulary without tokenizer.ggml.merges is not supported")
    spec = pre_tokenizer_spec(md.get("tokenizer.ggml.pre"))
    bpe = models.BPE(vocab=index, merges=_bpe_merges(merges, index), ignore_merges=spec.ignore_merges)
    backend = tokenizers.Tokenizer(bpe)
    backend.pre_tokenizer = spec.build()
    backend.decoder = decoders.ByteLevel()
    return backend, spec.name in ADD_BOS_PRE_TYPES


def _spm_backend(md: Mapping[str, Any], vocab: GGUFVocab, index: dict[str, int]) -> tokenizers.Tokenizer:
    scores = md.get("tokenizer.ggml.scores")
    unk = _as_int_or_none(md.get("tokenizer.ggml.unknown_token_id"))
    if unk is None and len(vocab.tokens) > 0:
        unk = 0
    bpe = models.BPE(
        vocab=index,
        merges=_spm_merges(vocab.tokens, vocab.types, scores, index),
        unk_token=vocab.tokens[unk] if unk is not None else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    backend = tokenizers.Tokenizer(bpe)
    add_space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    steps: list[normalizers.Normalizer] = []
    if add_space_prefix:
        steps.append(normalizers.Prepend(_SPM_SPACE))
    steps.append(normalizers.Replace(" ", _SPM_SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    dec: list[decoders.Decoder] = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(dec)
    return backend
