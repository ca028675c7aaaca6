"""Tokenizer built on the Hugging Face ``tokenizers`` library, from a GGUF vocabulary or a HF directory.

From GGUF metadata, a ``gpt2``-type vocabulary becomes a byte-level BPE whose pre-tokenizer reproduces
llama.cpp's for the file's ``tokenizer.ggml.pre`` value, and a ``llama``-type (SentencePiece) vocabulary
becomes a byte-fallback BPE whose merges are ranked by the token scores, which is how llama.cpp's SPM
tokenizer merges. Control, user-defined and unknown tokens are added tokens, so they are recognised as
single tokens in input text (llama.cpp's "special token partition"); control and unknown tokens are
"special" and are skipped by ``decode(..., skip_special_tokens=True)``, user-defined ones are not.

Pre-tokenization: llama.cpp splits text with an ordered list of regexes; each runs over the pieces from the
previous one, and matches and unmatched gaps both become pieces. That is a ``Sequence`` of
``Split(regex, "isolated")`` followed by the GPT-2 byte mapping (``ByteLevel(use_regex=False)``). The regex
lists restate llama.cpp's per-pre-type table. Where llama.cpp runs a hand-written matcher (GPT-2, Llama-3
patterns), the equivalent full regex is used (GPT-2's matcher includes the trailing ``|\\s+``). Where
llama.cpp approximates a Hugging Face regex its ``std::regex`` backend cannot express (cased letter classes),
the original Hugging Face regex is used.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from tokenmill.tokenizer.chat_template import ChatTemplateError, render_chat_template

logger = logging.getLogger(__name__)

__all__ = ["Tokenizer", "PreTokenizerSpec", "pre_tokenizer_spec", "EOG_TOKEN_TEXTS"]

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

# --------------------------------------------------------------------------------------------------------
# Pre-tokenizer regexes per tokenizer.ggml.pre value
# --------------------------------------------------------------------------------------------------------

_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS_CI
           + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTIONS_CI
           + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED_WORDS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+SUFFIX"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*SUFFIX")
_TEKKEN = _CASED_WORDS.replace("SUFFIX", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (_CASED_WORDS.replace("SUFFIX", "(?:" + _CONTRACTIONS_CI + ")?")
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CJK = r"[一-龥ࠀ-一가-퟿]+"

# pre-type -> (regexes, ignore_merges). With ignore_merges, a whole pre-token that is itself in the
# vocabulary becomes that token directly, without BPE merges (llama.cpp sets it for the Llama-3 family).
_PRE_TYPES: dict[str, tuple[tuple[str, ...], bool]] = {}


def _register(names: str, regexes: Sequence[str], ignore_merges: bool = False) -> None:
    for name in names.split():
        _PRE_TYPES[name] = (tuple(regexes), ignore_merges)


_register("default", [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"])
_register("gpt2 gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
          "jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4", [_GPT2])
_register("smollm starcoder refact command-r codeshell exaone minerva-7b mellum2", [r"\p{N}", _GPT2])
_register("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", [_LLAMA3],
          ignore_merges=True)
_register("dbrx smaug-bpe glm4 chatglm-bpe", [_LLAMA3])
_register("qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 megrez hunyuan solar-open grok-2", [_QWEN2])
_register("qwen35", [_QWEN35])
_register("falcon", [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"])
# Cased-letter ranges of deepseek-llm's word regex, escaped because several are compatibility characters
# (e.g. U+2126 OHM SIGN, U+212A KELVIN SIGN) that editors silently normalise to other code points.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370"
    "-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-"
    "\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
    "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-"
    "\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a"
    "-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-"
    "\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-"
    "\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_register("deepseek-llm", [
    r"[\r\n]",
    r"\s?[" + _DEEPSEEK_LETTERS + "]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
])
_register("deepseek-coder", [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"])
_register("deepseek-v3 hunyuan-dense joyai-llm hy_v4", [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3])
_register("poro-chat bloom gpt3-finnish", [_BLOOM])
_register("viking", [_BLOOM, r"\p{N}"])
_register("tekken", [_TEKKEN], ignore_merges=True)
_register("gpt-4o llama4 kanana2 talkie minimax-m2", [_GPT4O])
_register("seed-coder", [_CONTRACTIONS_CI
                         + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"])
_register("bailingmoe bailingmoe2 llada-moe", [
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"])
_register("ufakzeka", [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"])
_register("minicpm5", [r"\p{N}{1,3}", _CONTRACTIONS_CI
                       + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
          ignore_merges=True)
_register("exaone-moe", [_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                         r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"])
_register("jais-2", [_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                     r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
                     r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"])
_register("laguna", [r"[^\n]+|[\n]+", _QWEN2])

# llama.cpp turns add_bos on by default for these pre-types (the GGUF key add_bos_token overrides it).
_ADD_BOS_BY_DEFAULT = frozenset(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano tekken chameleon".split())


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How text is split before BPE for one ``tokenizer.ggml.pre`` value."""

    name: str  # the pre-type actually used (after any fallback)
    regexes: tuple[str, ...]
    ignore_merges: bool

    def build(self) -> pre_tokenizers.PreTokenizer:
        """The equivalent ``tokenizers`` pre-tokenizer (regex splits, then the GPT-2 byte mapping)."""
        steps: list[pre_tokenizers.PreTokenizer] = [
            pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.regexes
        ]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
        return pre_tokenizers.Sequence(steps)


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec:
    """The regex list llama.cpp uses for a GGUF ``tokenizer.ggml.pre`` value.

    A missing value means llama.cpp's ``default`` list; an unknown one falls back to GPT-2 with a warning.
    """
    if not pre:
        pre = "default"
    found = _PRE_TYPES.get(pre)
    if found is None:
        logger.warning("unknown tokenizer pre-type %r: falling back to the GPT-2 pre-tokenizer", pre)
        return PreTokenizerSpec("gpt2", (_GPT2,), False)
    return PreTokenizerSpec(pre, found[0], found[1])


def known_pre_types() -> frozenset[str]:
    """Every ``tokenizer.ggml.pre`` value with its own regex list."""
    return frozenset(_PRE_TYPES)


# --------------------------------------------------------------------------------------------------------
# GGUF vocabulary helpers
# --------------------------------------------------------------------------------------------------------


def _as_int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    return int(value)


@dataclass
class _GGUFVocab:
    """The vocabulary part of GGUF metadata, with llama.cpp's token-attribute fix-ups applied."""

    tokens: list[str]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    eog_ids: set[int]

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> _GGUFVocab:
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


# --------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------


class Tokenizer:
    """A text <-> token-id codec with chat-template rendering.

    Attributes:
        vocab_size: number of token ids (vocabulary plus added tokens).
        bos_token_id / eos_token_id: ids of the BOS / EOS tokens, or ``None``.
        bos_token / eos_token: their texts, or ``None``.
        eog_token_ids: ids that end generation (EOS plus end-of-turn style tokens found in the vocabulary).
        add_bos: whether ``encode`` prepends BOS by default.
        chat_template: Jinja chat template source, or ``None``.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        eog_token_ids: Iterable[int] = (),
        add_bos: bool = False,
        chat_template: str | None = None,
        template_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self._backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.bos_token: str | None = backend.id_to_token(bos_token_id) if bos_token_id is not None else None
        self.eos_token: str | None = backend.id_to_token(eos_token_id) if eos_token_id is not None else None
        eog = set(eog_token_ids)
        if eos_token_id is not None:
            eog.add(eos_token_id)
        self.eog_token_ids: frozenset[int] = frozenset(eog)
        self.add_bos = bool(add_bos and bos_token_id is not None)
        self.chat_template = chat_template
        self._special_ids = frozenset(i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        tokens = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        tokens.update(template_tokens or {})
        self._template_tokens = {k: v for k, v in tokens.items() if v is not None}

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer described by GGUF metadata (``GGUFFile(path).metadata``).

        Raises:
            NotImplementedError: the vocabulary type (``tokenizer.ggml.model``) is not supported.
        """
        model_type = metadata.get("tokenizer.ggml.model")
        vocab = _GGUFVocab.from_metadata(metadata)
        index = {t: i for i, t in enumerate(vocab.tokens)}
        if model_type == "gpt2":
            backend, default_add_bos = cls._gguf_bpe_backend(metadata, vocab, index)
        elif model_type == "llama":
            backend, default_add_bos = cls._gguf_spm_backend(metadata, vocab, index), True
        else:
            raise NotImplementedError(
                f"GGUF tokenizer type {model_type!r} is not supported (supported: 'gpt2' byte-level BPE and "
                "'llama' SentencePiece)")
        special, plain = vocab.added_tokens()
        backend.add_special_tokens(special)
        backend.add_tokens(plain)
        add_bos = metadata.get("tokenizer.ggml.add_bos_token")
        return cls(
            backend,
            bos_token_id=vocab.bos_id,
            eos_token_id=vocab.eos_id,
            eog_token_ids=vocab.eog_ids,
            add_bos=default_add_bos if add_bos is None else bool(add_bos),
            chat_template=metadata.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_gguf_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read the metadata of a ``.gguf`` file and build its tokenizer."""
        from tokenmill.loader.gguf import GGUFFile

        return cls.from_gguf(GGUFFile(path).metadata)

    @staticmethod
    def _gguf_bpe_backend(md: Mapping[str, Any], vocab: _GGUFVocab,
                          index: dict[str, int]) -> tuple[tokenizers.Tokenizer, bool]:
        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise NotImplementedError("GGUF BPE vocabulary without tokenizer.ggml.merges is not supported")
        spec = pre_tokenizer_spec(md.get("tokenizer.ggml.pre"))
        bpe = models.BPE(vocab=index, merges=_bpe_merges(merges, index), ignore_merges=spec.ignore_merges)
        backend = tokenizers.Tokenizer(bpe)
        backend.pre_tokenizer = spec.build()
        backend.decoder = decoders.ByteLevel()
        return backend, spec.name in _ADD_BOS_BY_DEFAULT

    @staticmethod
    def _gguf_spm_backend(md: Mapping[str, Any], vocab: _GGUFVocab, index: dict[str, int]) -> tokenizers.Tokenizer:
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

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a Hugging Face tokenizer directory.

        Reads ``tokenizer.json``; ``tokenizer_config.json`` (chat template, BOS/EOS tokens, ``add_bos_token``),
        ``chat_template.jinja`` if present, and EOS ids from ``generation_config.json`` / ``config.json``.
        """
        root = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(root / "tokenizer.json"))
        config = _read_json(root / "tokenizer_config.json")
        gen_config = _read_json(root / "generation_config.json")
        model_config = _read_json(root / "config.json")

        def token_text(value: Any) -> str | None:
            if isinstance(value, Mapping):
                value = value.get("content")
            return value if isinstance(value, str) else None

        def token_id(text: str | None) -> int | None:
            return backend.token_to_id(text) if text is not None else None

        bos_id = token_id(token_text(config.get("bos_token")))
        eos_ids: list[int] = []
        eos_id = token_id(token_text(config.get("eos_token")))
        if eos_id is not None:
            eos_ids.append(eos_id)
        for source in (gen_config, model_config):
            if bos_id is None and isinstance(source.get("bos_token_id"), int):
                bos_id = source["bos_token_id"]
            value = source.get("eos_token_id")
            eos_ids.extend([value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)])
        if eos_id is None and eos_ids:
            eos_id = eos_ids[0]
        eog = set(eos_ids)
        eog.update(i for i in (backend.token_to_id(t) for t in EOG_TOKEN_TEXTS) if i is not None)

        add_bos = config.get("add_bos_token")
        if add_bos is None:
            # No explicit flag: see whether the tokenizer's own post-processor prepends BOS.
            with_special = backend.encode("a", add_special_tokens=True).ids
            add_bos = bos_id is not None and bool(with_special) and with_special[0] == bos_id
        template_tokens = {k: token_text(config.get(k)) for k in ("unk_token", "pad_token", "sep_token",
                                                                    "cls_token", "mask_token")}
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            eog_token_ids=eog,
            add_bos=bool(add_bos),
            chat_template=_hf_chat_template(root, config),
            template_tokens={k: v for k, v in template_tokens.items() if v is not None},
        )

    # -- encoding / decoding ---------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._backend

    def _with_bos(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            return [self.bos_token_id, *ids]  # type: ignore[list-item]
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text become single tokens. With
        ``add_special_tokens`` and ``add_bos``, BOS is prepended unless the text already starts with it."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids, add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` for many texts at once (parallel, in the tokenizers library)."""
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [self._with_bos(e.ids, add_special_tokens) for e in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; control tokens are left out when ``skip_special_tokens``. Invalid UTF-8 becomes U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary string of a token id (byte-level form for BPE vocabularies)."""
        token = self._backend.id_to_token(int(token_id))
        if token is None:
            raise IndexError(f"token id {token_id} is out of range (vocab size {self.vocab_size})")
        return token

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string, or ``None``."""
        return self._backend.token_to_id(token)

    def is_special(self, token_id: int) -> bool:
        """Whether a token is a special (control) token, i.e. one ``decode`` skips."""
        return token_id in self._special_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of all special (control / unknown) tokens."""
        return self._special_ids

    # -- chat ------------------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        **extra: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (``chat_template=`` overrides it).

        Raises:
            ChatTemplateError: no template is available, or rendering failed.
        """
        template = extra.pop("chat_template", None) or self.chat_template
        if not template:
            raise ChatTemplateError("this tokenizer has no chat template")
        variables = {**self._template_tokens, **extra}
        return render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                    **variables)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r}, "
                f"add_bos={self.add_bos})")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _hf_chat_template(root: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template of a HF directory (``chat_template.jinja`` wins over the config entry)."""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
