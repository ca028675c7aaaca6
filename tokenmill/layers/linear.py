"""Linear layers and the methods that store and multiply their weights.

A `Linear` owns its parameters; a `LinearMethod` decides how the weight is kept and multiplied:

    create_weights(layer)      fp32 (out, in) weight (and bias) to load into, with per-shard loaders
    load(layer, tensor, shard) copy one checkpoint tensor into its rows (q/k/v or gate/up of a fused layer)
    finish_loading(layer)      after the model is at its device and dtype: convert (prepack, quantize)
    apply(layer, x)            x (T, in) -> (T, out)
    weight_bytes(out, in, b)   what the method keeps in memory (the memory plan asks compute.py, which
                               each method's answer comes from)

Methods:
- unquantized: F.linear on the weight at the compute dtype. On a CPU at fp32, a few rows (2 to ~64: a
  small decode batch, a speculative verification) go as (W @ x^T)^T instead when that measures faster at
  load: on the 2-core EPYC (Zen 3) torch's sgemm for x @ W^T with M = 2-16 rows took 2-3x the time of one
  row (it re-packs the weight per call), while W @ x^T streamed the weight once, as a 1-row product does
  (e.g. a (49152, 576) head at M=4: 25.7 vs 8.2 ms; M=1: 12.1 ms).
- prepacked: with bf16 on a CPU, F.linear hands oneDNN a plain weight that it reorders into its AMX layout
  at every call. Reordering once at load and calling oneDNN's linear on the packed weight measured 1.3-2x
  faster for decode-sized batches (1-64 rows) and ~1.1-1.3x for prefill-sized ones: one request decodes
  26.7 -> 35.8 tok/s, offline throughput +9% (benchmarks/README.md).
- gguf (layers/ggml_linear.py): ggml blocks (a GGUF file's own, or requantized at load) on ggml's kernels.
- int8: on CPUs without native bf16 a decode step at batch 1 is bound by reading fp32 weights. int8
  weights with bf16 activations (`torch._weight_int8pack_mm`) were measured 2.4x faster than fp32 at
  batch 1 on this class of CPU, equal at batch 16 and slower beyond (benchmarks/README.md): an opt-in
  mode for latency-bound, few-user serving. Every batch size uses the same kernel, so a request's tokens
  still do not depend on its neighbours.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.compute import linear_weight_bytes
from tokenmill.platforms.onednn import packed_linear, prepack

log = logging.getLogger("tokenmill")


class LinearMethod(ABC):
    name: str
    keeps_blocks = False  # the gguf method: the embedding keeps ggml blocks too

    def calibrate(self, layers: list[Linear], dtype: torch.dtype) -> None:
        """Once, after every layer finished loading: measure whatever the method decides by measuring."""

    def create_weights(self, layer: Linear) -> None:
        layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features), requires_grad=False)
        layer.weight.weight_loader = functools.partial(self.load, layer)  # type: ignore[attr-defined]
        layer.weight.shard_ids = list(layer.shards)  # type: ignore[attr-defined]

    def load(self, layer: Linear, param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        """Copy a checkpoint tensor (rows of the weight or bias) into `param` at the shard's rows."""
        a, b = layer.shard_rows(shard)
        if param.data[a:b].shape != tensor.shape:
            raise ValueError(f"weight shard {shard!r} has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(param.data[a:b].shape)}")
        param.data[a:b].copy_(tensor.to(torch.float32))

    def finish_loading(self, layer: Linear) -> None:
        """Called once the layer is at its device and dtype."""

    @abstractmethod
    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...

    def weight_bytes(self, out_features: int, in_features: int, dtype_bytes: int) -> int:
        return linear_weight_bytes(self.name, out_features, in_features, dtype_bytes)


class UnquantizedLinearMethod(LinearMethod):
    name = "unquantized"

    def __init__(self) -> None:
        self.max_transposed_rows = 0  # 2..this many rows: (W @ x^T)^T (calibrate decides; 0: never)

    def calibrate(self, layers: list[Linear], dtype: torch.dtype) -> None:
        """On a CPU at fp32: up to how many rows (W @ x^T)^T beats F.linear, timed on the decoder's most
        common shape (several layers in turn, so the weights come from memory as in a step).
        TOKENMILL_TRANSPOSED_MM_ROWS fixes it (0: off)."""
        fixed = os.environ.get("TOKENMILL_TRANSPOSED_MM_ROWS")
        if fixed is not None:
            self.max_transposed_rows = int(fixed)
            return
        if not layers or dtype != torch.float32 or layers[0].weight.device.type != "cpu":
            return
        shapes: dict[tuple[int, int], list[Linear]] = {}
        for lyr in layers:
            shapes.setdefault((lyr.out_features, lyr.in_features), []).append(lyr)
        group = max(shapes.values(), key=lambda g: len(g) * g[0].out_features * g[0].in_features)[:8]
        figures, best = [], 0
        for m in _TRANSPOSED_ROWS:
            x = torch.randn(m, group[0].in_features)
            t_linear = _best_time(lambda: [F.linear(x, lyr.weight) for lyr in group])
            t_mm = _best_time(lambda: [torch.mm(lyr.weight, x.t()) for lyr in group])
            figures.append(f"M={m} {t_linear * 1e3:.2f}/{t_mm * 1e3:.2f} ms")
            if t_mm >= 0.9 * t_linear:
                break
            best = m
        self.max_transposed_rows = best
        log.info("dense matmuls: W @ x^T for 2 to %d rows, F.linear otherwise (measured on %d (%d, %d) layers, "
                 "F.linear / W @ x^T: %s)", best, len(group), group[0].out_features, group[0].in_features,
                 ", ".join(figures))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if 1 < x.shape[0] <= self.max_transposed_rows and x.dim() == 2:
            if layer.bias is None:
                return torch.mm(layer.weight, x.t()).t().contiguous()
            return torch.addmm(layer.bias[:, None], layer.weight, x.t()).t().contiguous()
        return F.linear(x, layer.weight, layer.bias)


_TRANSPOSED_ROWS = (2, 4, 8, 16, 32, 64)


def _best_time(fn: Any, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps + 1):  # the first call warms
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class PrepackedLinearMethod(LinearMethod):
    """The weight is replaced by an empty tensor; `layer.packed` holds oneDNN's copy."""

    name = "prepacked"

    def finish_loading(self, layer: Linear) -> None:
        layer.packed = prepack(layer.weight.data)
        layer.weight.data = layer.weight.data.new_empty(0)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        assert layer.packed is not None, "finish_loading() prepacks the weight"
        return packed_linear(x, layer.packed, layer.bias)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> int8 (N, K) and bf16 scales (N,), symmetric per output channel."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(torch.bfloat16)


class Int8LinearMethod(LinearMethod):
    """The weight becomes int8 (N, K) with bf16 per-row scales in `layer.scales`; computed in bf16 and
    returned in x's dtype."""

    name = "int8"

    def finish_loading(self, layer: Linear) -> None:
        layer.weight.data, layer.scales = quantize_int8(layer.weight.data)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        assert layer.scales is not None, "finish_loading() quantizes the weight"
        y = torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), layer.weight, layer.scales).to(x.dtype)
        return y if layer.bias is None else y + layer.bias


LINEAR_METHODS: dict[str, type[LinearMethod]] = {
    m.name: m for m in (UnquantizedLinearMethod, PrepackedLinearMethod, Int8LinearMethod)
}


def get_linear_method(name: str, requant_type: str | None = None,
                      dense_copy: torch.dtype | None = None, vnni_pack: bool = False) -> LinearMethod:
    """`dense_copy`: the gguf method also keeps each matmul weight dense at this dtype (for big batches);
    `vnni_pack`: it packs the blocks its 16-bit VNNI kernel takes (the platform's compute.vnni_pack)."""
    if name == "gguf":  # imported here: it needs the native library, the others do not
        from tokenmill.layers.ggml_linear import GGUFLinearMethod

        return GGUFLinearMethod(requant_type, dense_copy=dense_copy, vnni_pack=vnni_pack)
    if dense_copy is not None:
        raise ValueError(f"a dense copy is the gguf method's; the {name} method's weights are dense already")
    if name not in LINEAR_METHODS:
        raise ValueError(f"unknown linear method {name!r}; known: {', '.join(LINEAR_METHODS)}, gguf")
    return LINEAR_METHODS[name]()


class Linear(nn.Module):
    """y = x @ W.T (+ b). A fused layer lists its shards (name -> rows, in order): a fused q|k|v
    projection is `Linear(d, q + 2 kv, shards={"q": q, "k": kv, "v": kv})`, loaded from three
    checkpoint tensors."""

    def __init__(self, in_features: int, out_features: int, method: LinearMethod, bias: bool = False,
                 shards: dict[str, int] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.method = method
        self.shards = dict(shards or {})
        if self.shards and sum(self.shards.values()) != out_features:
            raise ValueError(f"shards {self.shards} do not add up to {out_features} rows")
        self.packed: torch.Tensor | None = None  # prepacked method: oneDNN's copy of the weight
        self.scales: torch.Tensor | None = None  # int8 method: per-row scales
        # gguf method (layers/ggml_linear.py): blocks per shard while loading, then ggml's matrices
        self.blocks: dict[str | None, Any] = {}
        self.matmul: Any = None
        self.dense: list[tuple[Any, int]] = []
        self.dense_ok = False
        self.block_mm: list[tuple[int, int, int, int]] | None = None  # plain blocks for native/block_matmul.cpp
        self.packed_blocks: list[Any] = []  # the buffers of block_mm's packed matrices (type codes with PACKED)
        self.block_amx = False  # block_mm's matrices also fit the AMX kernel (native/amx_matmul.cpp)
        # where a weight is ggml's repacked Q4_K or (on AMX) a K-quant: (weight, first output column, its one-weight
        # matmul, or None for the repacked Q4_K ones, whose big batches run on the plain-block kernel read back;
        # whether bf16 big batches take the AMX kernel instead): GGUFLinearMethod._plain
        self.plain: list[tuple[Any, int, Any, bool]] | None = None
        # The output head sets this: where the gguf method's kernel computes fp32 outputs (its block, AMX and
        # ggml kernels), they are returned as they are instead of rounded to a bf16 x's dtype, so greedy picks
        # and logprobs see the kernel's values (bf16 logits tie: SmolLM2's first answer token to "What is the
        # capital of France?" came out as an exact tie between "The" and "L", decided by token id). Its
        # oneDNN dense path, and the other methods, still give x's dtype.
        self.wide_out = False
        # A mixture of experts' matrix (a routed or shared expert's; SparseMoE.mark_experts sets it before the
        # weights are finished): the gguf method leaves those of the types the MoE one-call path multiplies on
        # ggml instead of packing them (GGUFLinearMethod._packs)
        self.expert = False
        self.weight: nn.Parameter
        method.create_weights(self)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False)
            self.bias.weight_loader = functools.partial(method.load, self)  # type: ignore[attr-defined]
            self.bias.shard_ids = list(self.shards)  # type: ignore[attr-defined]
            self.bias.is_required = False  # type: ignore[attr-defined]

    def shard_rows(self, shard: str | None) -> tuple[int, int]:
        if shard is None:
            return 0, self.out_features
        start = 0
        for name, rows in self.shards.items():
            if name == shard:
                return start, start + rows
            start += rows
        raise ValueError(f"unknown shard {shard!r} (this layer has {list(self.shards)})")

    def finish_loading(self) -> None:
        self.method.finish_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, in_features) -> (T, out_features)."""
        return self.method.apply(self, x)
