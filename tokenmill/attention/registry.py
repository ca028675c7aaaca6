"""Attention backends by name, imported lazily (a CUDA kernel backend must not load on a CPU)."""

from __future__ import annotations

import importlib

import torch

from tokenmill.attention.backend import AttentionBackend

_BACKENDS = {
    "paged": ("tokenmill.attention.paged", "PagedAttentionBackend"),
    "decode_mirror": ("tokenmill.attention.decode_mirror", "MirrorAttentionBackend"),
    "native": ("tokenmill.attention.native_paged", "NativePagedAttentionBackend"),
}


def create_attention_backend(name: str, block_size: int, device: torch.device, kv: torch.Tensor,
                             mirror_bytes: int = 0) -> AttentionBackend:
    """kv: the whole paged cache (2, layers, num_blocks, block_size, nkv, hd)."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {', '.join(_BACKENDS)}")
    module, cls_name = _BACKENDS[name]
    cls = getattr(importlib.import_module(module), cls_name)
    if name == "decode_mirror":
        return cls(block_size, device, kv, mirror_bytes)  # type: ignore[no-any-return]
    if name == "native":
        return cls(block_size, device, kv)  # type: ignore[no-any-return]
    return cls(block_size, device)  # type: ignore[no-any-return]
