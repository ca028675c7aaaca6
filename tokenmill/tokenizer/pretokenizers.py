"""llama.cpp's pre-tokenizers: the ordered regex list for each GGUF ``tokenizer.ggml.pre`` value.

llama.cpp splits text with an ordered list of regexes; each runs over the pieces from the previous one, and
matches and unmatched gaps both become pieces. That is a ``Sequence`` of ``Split(regex, "isolated")``
followed by the GPT-2 byte mapping (``ByteLevel(use_regex=False)``). The regex lists restate llama.cpp's
per-pre-type table. Where llama.cpp runs a hand-written matcher (GPT-2, Llama-3 patterns), the equivalent
full regex is used (GPT-2's matcher includes the trailing ``|\\s+``). Where llama.cpp approximates a Hugging
Face regex its ``std::regex`` backend cannot express (cased letter classes), the original Hugging Face regex
is used.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

logger = logging.getLogger(__name__)

__all__ = ["ADD_BOS_PRE_TYPES", "PreTokenizerSpec", "known_pre_types", "pre_tokenizer_spec"]

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
ADD_BOS_PRE_TYPES = frozenset(
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
