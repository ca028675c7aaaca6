"""Model registry: architecture -> (module, class), imported only when that architecture is loaded."""

from __future__ import annotations

import importlib
from typing import Any

_LLAMA = ("tokenmill.models.llama", "LlamaForCausalLM")

# ModelConfig.architecture (GGUF general.architecture / HF model_type) -> implementation
MODELS: dict[str, tuple[str, str]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "smollm": _LLAMA,
}


def supported_architectures() -> list[str]:
    return sorted(MODELS)


def get_model_class(architecture: str) -> Any:
    """The CausalLM class for an architecture; a ValueError listing the supported ones otherwise."""
    if architecture not in MODELS:
        raise ValueError(f"architecture {architecture!r} is not supported; supported: "
                         f"{', '.join(supported_architectures())}")
    module, name = MODELS[architecture]
    return getattr(importlib.import_module(module), name)
