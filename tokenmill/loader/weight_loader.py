"""Load checkpoint tensors into a model that knows how its parameters take them (no model knowledge here).

For each `(name, tensor)` from a reader:
  0. a model with a `checkpoint_stream` first reshapes the stream as its family's checkpoints need
     (gpt-oss: stacked, transposed, interleaved or MXFP4 experts, models/gpt_oss.py); then
     a checkpoint module named in the model's `checkpoint_renames` (if it has one) takes that name, and a
     name with `{e}` in it is a stack of experts along dim 0, split into one tensor per expert (Granite
     MoE's `block_sparse_moe.input_linear`, (E, 2I, D) -> `mlp.experts.{e}.gate_up_proj`, (2I, D) each);
  1. the model may take it as an extra (e.g. stored rotary factors): `load_extra_weight`;
  2. a checkpoint module named in the model's `packed_modules_mapping` is renamed to the fused module it
     lives in, with its shard: `...self_attn.k_proj.weight` -> `...self_attn.qkv_proj.weight`, shard "k";
     an entry with shard None only renames (Mixtral's `block_sparse_moe` -> `mlp`); every named part of
     the name is mapped;
  3. the parameter's own `weight_loader(param, tensor, shard)` copies it in (a plain copy if it has none).
A checkpoint that stores a fused module itself (phi3's `qkv_proj`, `gate_up_proj`) names our parameter
directly: it arrives with shard None, all rows at once, and counts for every shard.
Afterwards every required parameter (and every shard of a fused one) must have been loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def default_weight_loader(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
    if param.data.shape != tensor.shape:
        raise ValueError(f"weight has shape {tuple(tensor.shape)}, expected {tuple(param.data.shape)}")
    param.data.copy_(tensor.to(torch.float32))


def load_weights(model: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """`model`: an nn.Module with `packed_modules_mapping` and `load_extra_weight` (models/interface.py);
    `weights`: (name, tensor) pairs, a tensor being dense or a method's blocks (loader/weights.py)."""
    params: dict[str, nn.Parameter] = dict(model.named_parameters())
    mapping: dict[str, tuple[str, str | None]] = model.packed_modules_mapping
    loaded: set[tuple[str, str | None]] = set()
    renames: dict[str, str] = getattr(model, "checkpoint_renames", {})
    stream = getattr(model, "checkpoint_stream", None)  # a family's own reshaping of its checkpoint (gpt-oss)
    if stream is not None:
        weights = stream(weights)
    for name, tensor in _renamed(weights, renames) if renames else weights:
        if model.load_extra_weight(name, tensor):
            continue
        parts, shard = name.split("."), None
        for i, part in enumerate(parts):
            if part in mapping:
                parts[i], part_shard = mapping[part]
                shard = part_shard if part_shard is not None else shard
        target = ".".join(parts)
        param = params.get(target)
        if param is None:
            raise ValueError(f"unexpected weight {name}")
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, tensor, shard)
        loaded.add((target, shard))
        if shard is None:  # the whole fused tensor: every shard's rows
            loaded.update((target, s) for s in getattr(param, "shard_ids", None) or [])
    reverse = {(fused, shard): src for src, (fused, shard) in mapping.items() if shard is not None}
    missing: list[str] = []
    for pname, param in params.items():
        if not getattr(param, "is_required", True):
            continue
        for shard in getattr(param, "shard_ids", None) or [None]:
            if (pname, shard) not in loaded:
                parts = pname.split(".")
                src = reverse.get((parts[-2], shard)) if shard is not None and len(parts) > 1 else None
                missing.append(".".join(parts[:-2] + [src, parts[-1]]) if src else pname)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}")


def _renamed(weights: Iterable[tuple[str, Any]], renames: dict[str, str]) -> Iterable[tuple[str, Any]]:
    """Step 0 above: `.{module}.` in a name becomes `.{renames[module]}.`; a stack is split by expert."""
    for name, tensor in weights:
        stacked = False
        for module, ours in renames.items():
            if f".{module}." in name:
                name = name.replace(f".{module}.", f".{ours}.")
                stacked = stacked or "{e}" in ours
        if stacked:
            yield from ((name.format(e=e), tensor[e]) for e in range(tensor.shape[0]))
        else:
            yield name, tensor
