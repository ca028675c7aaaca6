"""Fixtures of the model tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def reference(default_model_path: str):
    """HF transformers loading the default GGUF on its own (it dequantises and un-permutes itself), fp32."""
    transformers = pytest.importorskip("transformers")
    p = Path(default_model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    model.eval()
    return model
