"""Tokenizer: the text <-> token-id codec with chat-template rendering, over a Hugging Face ``tokenizers``
backend built from a GGUF vocabulary (gguf_vocab.py, with llama.cpp's pre-tokenizers from pretokenizers.py)
or read from a HF directory (hf.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tokenizers

from tokenmill.tokenizer.builtin_templates import builtin_chat_template
from tokenmill.tokenizer.chat_template import ChatTemplateError, render_chat_template
from tokenmill.tokenizer.gguf_vocab import EOG_TOKEN_TEXTS, build_gguf_backend
from tokenmill.tokenizer.hf import read_hf_dir
from tokenmill.tokenizer.pretokenizers import PreTokenizerSpec, known_pre_types, pre_tokenizer_spec

log = logging.getLogger(__name__)

__all__ = ["Tokenizer", "PreTokenizerSpec", "pre_tokenizer_spec", "known_pre_types", "EOG_TOKEN_TEXTS"]


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
        self._added_ids = frozenset(backend.get_added_tokens_decoder())
        self._byte_decoder: dict[str, int] | None = None  # token_bytes' table ({} : not a byte-level vocabulary)
        self._token_texts: dict[int, str] = {}  # token_text's cache
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
        backend, vocab, default_add_bos = build_gguf_backend(metadata)
        add_bos = metadata.get("tokenizer.ggml.add_bos_token")
        template = metadata.get("tokenizer.chat_template")
        arch = str(metadata.get("general.architecture", ""))
        if template is None and (template := builtin_chat_template(arch)) is not None:
            log.info("the GGUF has no chat template: using the %s template its maker publishes", arch)
        return cls(
            backend,
            bos_token_id=vocab.bos_id,
            eos_token_id=vocab.eos_id,
            eog_token_ids=vocab.eog_ids,
            add_bos=default_add_bos if add_bos is None else bool(add_bos),
            chat_template=template,
        )

    @classmethod
    def from_gguf_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read the metadata of a ``.gguf`` file and build its tokenizer."""
        from tokenmill.loader.gguf import GGUFFile

        return cls.from_gguf(GGUFFile(path).metadata)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a Hugging Face tokenizer directory.

        Reads ``tokenizer.json``; ``tokenizer_config.json`` (chat template, BOS/EOS tokens, ``add_bos_token``),
        ``chat_template.jinja`` if present, and EOS ids from ``generation_config.json`` / ``config.json``.
        """
        files = read_hf_dir(path)
        return cls(files.backend, bos_token_id=files.bos_token_id, eos_token_id=files.eos_token_id,
                   eog_token_ids=files.eog_token_ids, add_bos=files.add_bos, chat_template=files.chat_template,
                   template_tokens=files.template_tokens)

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

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (a piece of a character is U+FFFD): what logprobs show.
        Cached by id."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id], skip_special_tokens=False)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for: a byte-level BPE token's own bytes, a SentencePiece byte token's
        byte, even where they are part of a UTF-8 character (which decode() shows as U+FFFD); the text of
        added (special) tokens."""
        if self._byte_decoder is None:
            self._byte_decoder = _byte_decoder(self._backend)
        token = self.id_to_token(token_id)
        if token_id in self._added_ids:
            return token.encode()
        if self._byte_decoder:  # byte-level: each character of the token is one byte
            try:
                return bytes(self._byte_decoder[ch] for ch in token)
            except KeyError:
                return token.encode()
        if m := _SPM_BYTE.fullmatch(token):
            return bytes([int(m.group(1), 16)])
        return token.replace("\u2581", " ").encode()

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
        continue_final_message: bool = False,
        tokenize: bool = False,
        **extra: Any,
    ) -> Any:
        """Render ``messages`` with the model's chat template (``chat_template=`` overrides it);
        ``continue_final_message`` leaves the final message open for the model to continue. ``tokenize``
        (HF's argument; here False unless given): the token ids of the text instead (the template's own
        special tokens included, nothing added).

        Raises:
            ChatTemplateError: no template is available, or rendering failed.
        """
        template = extra.pop("chat_template", None) or self.chat_template
        if not template:
            raise ChatTemplateError("this tokenizer has no chat template")
        variables = {**self._template_tokens, **extra}
        text = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                    continue_final_message=continue_final_message, **variables)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    # -- what scripts written for an HF tokenizer call ----------------------------------------------------
    def __len__(self) -> int:
        return self.vocab_size

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Vocabulary strings of ids (HF's name)."""
        return self.id_to_token(ids) if isinstance(ids, int) else [self.id_to_token(i) for i in ids]

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r}, "
                f"add_bos={self.add_bos})")


_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder(backend: tokenizers.Tokenizer) -> dict[str, int]:
    """GPT-2's character -> byte table when the vocabulary is byte-level (its decoder is, or contains, a
    ByteLevel decoder); {} otherwise."""
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders") or []]
    if "ByteLevel" not in kinds:
        return {}
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):  # printable bytes stand for themselves, the others for 256, 257, ... in order
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table
