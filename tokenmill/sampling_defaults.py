"""The model's own sampling defaults: what a request that leaves a sampling field out gets, as vLLM's
`--generation-config auto` (its default) and llama-server do (torch-free).

A model's authors recommend settings: an HF checkpoint in generation_config.json (`temperature`, `top_p`,
`top_k`, `min_p`, `repetition_penalty`, `max_new_tokens`), a GGUF in `general.sampling.*` (llama.cpp's
converter writes them from that file: `temp`, `top_p`, `top_k`, `min_p`, `penalty_repeat`). Each one given
replaces the API's own default for that field (OpenAI's temperature 1, Ollama's 0.8, ...); a field the
request sets always wins. As vLLM does, generation_config.json values equal to transformers' defaults
(temperature 1, top_p 1, top_k 50, repetition_penalty 1) are not taken as a recommendation.

`--generation-config`: auto (the model's, the default), vllm (none: each API's own defaults), or a
directory holding a generation_config.json. `--override-generation-config` (JSON, generation_config.json's
key names) sets or replaces single values on top of that, as vLLM's flag does.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger("tokenmill")

# generation_config.json key -> our field; with transformers' default, which vLLM does not take as advice
_HF_KEYS: dict[str, tuple[str, float | None]] = {
    "temperature": ("temperature", 1.0), "top_p": ("top_p", 1.0), "top_k": ("top_k", 50),
    "min_p": ("min_p", None), "repetition_penalty": ("repetition_penalty", 1.0),
    "max_new_tokens": ("max_tokens", None)}
# general.sampling.<key> -> our field
_GGUF_KEYS = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
              "penalty_repeat": "repetition_penalty"}
# GGUF sampling keys for samplers this server does not have: a recommendation it cannot follow (logged)
_GGUF_UNFOLLOWED = ("mirostat", "mirostat_tau", "mirostat_eta", "xtc_probability", "xtc_threshold",
                    "penalty_last_n", "sequence")


@dataclass(frozen=True)
class SamplingDefaults:
    """Each field: the model's recommendation, or None (the API's own default applies)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    source: str = ""  # where they came from, for the log

    def given(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if f.name != "source" and (v := getattr(self, f.name)) is not None}

    def pick(self, name: str, requested: Any, api_default: Any) -> Any:
        """The request's value if it set one, else the model's, else the API's default."""
        if requested is not None:
            return requested
        model = getattr(self, name)
        return api_default if model is None else model

    def describe(self) -> str:
        given = self.given()
        if not given:
            return ""
        return (f"default sampling from {self.source}: " + ", ".join(f"{k}={v}" for k, v in given.items())
                + " (a request's own values win; --generation-config vllm uses each API's defaults instead)")


def _number(value: Any, as_int: bool) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if as_int else float(value)


def from_generation_config(path: Path) -> SamplingDefaults:
    """generation_config.json at `path` (a file or a directory holding one); none if absent."""
    file = path / "generation_config.json" if path.is_dir() else path
    if not file.is_file():
        return SamplingDefaults()
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not readable as JSON ({e})") from None
    values: dict[str, Any] = {}
    for key, (name, hf_default) in _HF_KEYS.items():
        v = _number(raw.get(key), name in ("top_k", "max_tokens"))
        if v is not None and v != hf_default:
            values[name] = v
    return SamplingDefaults(**values, source=str(file))


def from_gguf(metadata: dict[str, Any], name: str) -> SamplingDefaults:
    """A GGUF's general.sampling.* keys; `name` names the file in the log."""
    values: dict[str, Any] = {}
    for key, field in _GGUF_KEYS.items():
        v = _number(metadata.get(f"general.sampling.{key}"), field == "top_k")
        if v is not None:
            values[field] = v
    ignored = [k for k in _GGUF_UNFOLLOWED if metadata.get(f"general.sampling.{k}") not in (None, 0)]
    if ignored:
        log.info("%s recommends sampling settings this server has no sampler for (general.sampling.%s): not "
                 "applied", name, ", general.sampling.".join(ignored))
    return SamplingDefaults(**values, source=f"{name} (general.sampling)")


GENERATION_CONFIG_CHOICES = ("auto", "vllm")


def check_override(override: dict[str, Any]) -> dict[str, Any]:
    """--override-generation-config's values as our fields; a ValueError names a key or value it cannot take."""
    out: dict[str, Any] = {}
    for key, value in override.items():
        if key not in _HF_KEYS:
            raise ValueError(f"--override-generation-config: {key!r} is not a sampling setting this server takes "
                             f"({', '.join(_HF_KEYS)})")
        name = _HF_KEYS[key][0]
        number = _number(value, name in ("top_k", "max_tokens"))
        if number is None or (name in ("top_k", "max_tokens") and not isinstance(value, int)):
            raise ValueError(f"--override-generation-config: {key} must be a number, got {value!r}")
        out[name] = number
    return out


def resolve(setting: str, kind: str, model_path: Path, metadata: dict[str, Any] | None,
            override: dict[str, Any] | None = None) -> SamplingDefaults:
    """`setting` (--generation-config): auto -> the model's (`kind` "gguf": its metadata, "hf": the
    directory's generation_config.json); vllm -> none; else a directory (or file) with a generation_config.json.
    `override` (--override-generation-config) then sets its keys."""
    if setting == "vllm":
        base = SamplingDefaults()
    elif setting == "auto":
        base = from_gguf(metadata or {}, model_path.name) if kind == "gguf" else from_generation_config(model_path)
    else:
        path = Path(setting)
        if not (path / "generation_config.json").is_file() and not path.is_file():
            raise ValueError(f"--generation-config {setting!r}: no generation_config.json there (auto, vllm, or a "
                             "directory holding one)")
        base = from_generation_config(path)
    if not override:
        return base
    values = base.given() | check_override(override)
    return SamplingDefaults(**values, source=(base.source + " and " if base.source else "")
                            + "--override-generation-config")
