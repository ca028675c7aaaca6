"""The model registry: one table names every architecture; unknown ones fail at once, listing ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenmill.loader import architectures
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.registry import get_model_class


def test_every_row_names_an_importable_causal_lm() -> None:
    for arch in architectures.ARCHITECTURES.values():
        cls = get_model_class(arch.name)
        assert hasattr(cls, "packed_modules_mapping") and hasattr(cls, "compute_logits"), arch.name
        assert arch.hf_classes and arch.gguf_names


def test_unknown_gguf_architecture_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError) as e:
        ModelConfig.from_gguf({"general.architecture": "mamba"}, set(), "F32")
    assert "'mamba' is not supported" in str(e.value)
    for name in architectures.ARCHITECTURES:
        assert name in str(e.value)


def test_unknown_hf_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"}))
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_dir(tmp_path)
    assert "MambaForCausalLM" in str(e.value) and "LlamaForCausalLM" in str(e.value)


def test_names_resolve_both_ways() -> None:
    assert architectures.from_gguf_name("smollm").name == "llama"
    assert architectures.from_gguf_name("olmo2").name == "olmo2"  # (OLMo 3 by its window: ModelConfig.from_gguf)
    assert architectures.from_hf_config(["Qwen2ForCausalLM"], None).name == "qwen2"
    assert architectures.from_hf_config([], "mistral").name == "mistral"
