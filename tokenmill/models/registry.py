"""Model registry: architecture -> its CausalLM class, imported only when that architecture is loaded.

The table of architectures and their names lives in loader/architectures.py (torch-free, so the loader,
the plan and the CLI read it too); this module imports the implementation a row names.
"""

from __future__ import annotations

import importlib
from typing import Any

from tokenmill.loader import architectures


def supported_architectures() -> list[str]:
    return sorted(architectures.ARCHITECTURES)


def get_model_class(architecture: str) -> Any:
    """The CausalLM class for an architecture; a ValueError listing the supported ones otherwise."""
    module, name = architectures.get(architecture).implementation.split(":")
    return getattr(importlib.import_module(module), name)
