"""A Hugging Face tokenizer directory: ``tokenizer.json`` plus the configs that name BOS, EOS and the template."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers

from tokenmill.tokenizer.gguf_vocab import EOG_TOKEN_TEXTS

__all__ = ["HFTokenizerFiles", "read_hf_dir"]


@dataclass
class HFTokenizerFiles:
    """What a HF directory says about its tokenizer: the backend and the Tokenizer's settings."""

    backend: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    eog_token_ids: frozenset[int]
    add_bos: bool
    chat_template: str | None
    template_tokens: dict[str, str] = field(default_factory=dict)


def read_hf_dir(path: str | os.PathLike[str]) -> HFTokenizerFiles:
    """Read ``tokenizer.json``; ``tokenizer_config.json`` (chat template, BOS/EOS tokens, ``add_bos_token``),
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
    by_text = {t: i for t in EOG_TOKEN_TEXTS if (i := backend.token_to_id(t)) is not None}
    eog.update(by_text.values())
    # gpt-oss (harmony): "<|end|>" ends a message, not the answer, which ends at "<|return|>" or "<|call|>"
    # (llama.cpp's rule, as gguf_vocab.py applies it); unless the configs name it themselves
    end = by_text.get("<|end|>")
    if end is not None and "<|return|>" in by_text and "<|call|>" in by_text and end not in eos_ids:
        eog.discard(end)

    add_bos = config.get("add_bos_token")
    if add_bos is None:
        # No explicit flag: see whether the tokenizer's own post-processor prepends BOS.
        with_special = backend.encode("a", add_special_tokens=True).ids
        add_bos = bos_id is not None and bool(with_special) and with_special[0] == bos_id
    template_tokens = {k: token_text(config.get(k)) for k in ("unk_token", "pad_token", "sep_token",
                                                                "cls_token", "mask_token")}
    return HFTokenizerFiles(
        backend=backend,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        eog_token_ids=frozenset(eog),
        add_bos=bool(add_bos),
        chat_template=_chat_template(root, config),
        template_tokens={k: v for k, v in template_tokens.items() if v is not None},
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _chat_template(root: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template of a HF directory (``chat_template.jinja`` wins over the config entry)."""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
