"""How `tokenmill serve` finds and names its models, and Ollama's keep-alive durations (no model loads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenmill.config import EngineConfig
from tokenmill.entrypoints.server.served_model import (SEVERAL_MODELS_KV_CACHE_BYTES, engine_config_for,
                                                       name_models, parse_keep_alive)
from tokenmill.loader.model_source import default_model_path


@pytest.mark.parametrize("value, seconds", [("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("300", 300.0),
                                            (300, 300.0), (2.5, 2.5), ("0", 0.0), (0, 0.0), ("-1", None), (-1, None),
                                            ("-5m", None), (" 10s ", 10.0)])
def test_keep_alive_durations(value: str | float, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 m", "m", "", "1d", True])
def test_keep_alive_refuses_what_is_not_a_duration(value: str | bool) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_keep_alive(value)


def test_names_from_files_and_metadata(tmp_path: Path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    (d / "small.gguf").symlink_to(default_model_path())  # metadata: basename smollm2, size label 135M
    hf = d / "tiny-hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    (d / "notes.txt").write_text("not a model")
    named = name_models(["default"], str(d), None)
    assert named == [("SmolLM2-135M-Instruct", "default"), ("smollm2:135m", str(d / "small.gguf")),
                     ("tiny-hf", str(hf))]
    assert name_models(["default"], None, "mine") == [("mine", "default")]
    with pytest.raises(ValueError, match="--served-model-name names a single model"):
        name_models(["default"], str(d), "mine")


def test_two_models_with_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "m.gguf").symlink_to(default_model_path())
    (b / "m.gguf").symlink_to(default_model_path())
    with pytest.raises(ValueError, match=rf"two models are both named 'm': {a / 'm.gguf'} and {b / 'm.gguf'}"):
        name_models([str(a / "m.gguf"), str(b / "m.gguf")], None, None)
    with pytest.raises(FileNotFoundError, match="holds no .gguf file"):
        name_models([], str(tmp_path), None)  # two directories, neither a model


def test_several_models_get_a_fixed_kv_cache_share() -> None:
    base = EngineConfig()
    assert engine_config_for(base, "x.gguf", 1).kv_cache_memory is None  # one model: the usual default
    assert engine_config_for(base, "x.gguf", 3).kv_cache_memory == SEVERAL_MODELS_KV_CACHE_BYTES
    given = EngineConfig(kv_cache_memory=2**26)
    assert engine_config_for(given, "x.gguf", 3) == EngineConfig(model="x.gguf", kv_cache_memory=2**26)
