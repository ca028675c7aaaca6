"""The gguf linear method: matmul weights kept as ggml blocks (a GGUF file's own, or requantized at load),
multiplied by ggml's CPU kernels (native/ggml.py).

A weight arrives per shard as `GGUFQuantized` blocks (zero-copy views of the file's mmap) or, from an
unquantized checkpoint with `--quantization q8_0|q4_k|...`, as a dense tensor that ggml's quantizer turns
into blocks at once (so an fp32 copy of the whole model never exists). At finish_loading, adjacent shards
of one type (q|k|v, gate|up) are joined into one matrix, and each matrix is handed to ggml, repacked into
an interleaved layout where the running CPU has one for its type (Q4_0 / Q4_K / IQ4_NL on AVX2; more with
AVX-512 and AMX), else used in place; Q4_K stays in place for our kernel (_keeps_plain) except on AVX-512
without AMX (q4k_plain_here).

Per call, by the number of rows M:
- M <= max_ggml_rows: block kernels on 8-bit activations per 32-block as in llama.cpp (ggml's, ~5e-3
  relative error against the fp32 dequantized reference), except plain Q4_0 / Q4_1 / Q8_0 blocks, which our
  own multi-row kernel multiplies with 16-bit activations (native/block_matmul.cpp: ~1e-5 from x's rounding,
  so the result is the weights' own; each weight block unpacked once for up to 8 rows, 1.2-1.8x ggml's
  speed at 2-16 rows, about its speed at one), and plain Q4_K / Q5_K / Q6_K blocks, which native/kquant_matmul.cpp
  multiplies the same way (x per 256 values for Q5_K / Q6_K, their sums integers across a super-block: ~3e-5 /
  ~6e-5; a 7B Q4_K_M file's matrices at one row: 21-22 GB/s against 14-17 for ggml's
  kernels, repacked Q4_K included); at bf16 compute on a CPU with AMX the 32-element blocks go to the
  AMX kernel instead (native/amx_matmul.cpp: each block dequantized to bf16 in registers, as the dense bf16
  copy holds it, and multiplied on the tile unit for up to 64 rows at a time: it reads the blocks' 4.5-8.5
  bits a weight where the dense copy reads 16, and decode steps of a few to 64 rows are bound by that);
- from panel_min_rows rows (where calibrate measured it faster than the block kernel; fp32 CPUs without AMX:
  16-32 rows on a 2-core AVX2 EPYC), plain Q4_0 / Q4_1 / Q8_0 blocks go to the fp32 panel kernel instead
  (native/panel_matmul.cpp: 16 weight rows at a time dequantized into an L2-sized fp32 panel, every row of
  x multiplied into it by an FMA register tile: 150-190 GFLOPS at 64-512 rows there, against ~90 for the
  integer kernel and ~155 for dequantize + F.linear), x unrounded; at bf16 on CPUs with AVX512-VNNI and no
  AMX a VNNI panel kernel instead (native/vnni_matmul.cpp, block_matmul.vnni_bits): by default x at 16 bits
  per 32-block as the block kernel rounds it, int16 products on vpdpwssd (on Zen 4 1.5-2x the fp32 panel;
  against the prepacked bf16 copy 0.9-2.7x at 4-8 rows, 0.9-1.16x at 16, 0.76-0.98x from 32, so calibration
  keeps the copy for big batches where there is one); with TOKENMILL_VNNI_MATMUL=1 x at 8 bits as in llama.cpp, on vpdpbusd (the
  default model's layers 1.3-1.6x the copy at 8-512 rows on Zen 4, the (576, 1536) ones 0.9-1.2x, and a
  file it covers keeps no copy: compute.int8_panel_covers);
- above max_ggml_rows: each matrix is dequantized tile by tile into a scratch buffer and multiplied by F.linear at the
  compute dtype (oneDNN), which wins for big batches on CPUs where ggml's plain-block kernels are
  compute-bound. Repacked matrices have no plain blocks left; the shim reads ggml's repacked Q4_K back
  into plain blocks a tile at a time (ggml_shim.cpp, tm_weight_dequantize), so those take this path too
  (a 7B Q4_K_M file on AMX: a 128-token prompt in 3.8 s instead of 6.4 on ggml's repacked kernel); at bf16
  on AMX, Q4_K, Q5_K and Q6_K matrices (read back, or plain) go to the AMX kernel there instead (_amx_blocks:
  that prompt 1.3-1.7x faster again);
  other repacked layouts (Q4_0, IQ4_NL) always take ggml's path, as do F32 matrices (a MoE router),
  which ggml cannot "dequantize";
- or, with a dense copy (`dense_copy`, compute.choose_dense_copy: on by default only with bf16 on an AMX
  CPU, for models whose copy is small beside the RAM), above the crossover every matrix (repacked ones
  too: the copy is made from the plain blocks before repacking) is multiplied by its whole dense copy,
  oneDNN-prepacked at bf16, with nothing dequantized per call.
`calibrate` measures the crossover once at start on this machine and logs it (TOKENMILL_GGML_MAX_ROWS
overrides). Within one path each output row depends only on its own input row (checked by the tests);
across the crossover results differ at the kernel-error level.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from tokenmill.compute import UNQUANTIZED_TYPES, requant_type_for, vnni_packs
from tokenmill.cpu_features import cpu_flags, cpu_model
from tokenmill.layers.calibration_cache import CACHE_ENV, CALIBRATIONS, Crossover
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.thread_choice import ThreadChooser
from tokenmill.loader.weights import GGUFQuantized, nothing
from tokenmill.native import block_matmul, ggml
from tokenmill.platforms import can_prepack_here
from tokenmill.platforms.onednn import packed_linear, prepack

log = logging.getLogger("tokenmill")

_TILE_ELEMS = 1 << 22  # dense path: dequantize at most 4M values (16 MB fp32) at a time
_CALIBRATION_ROWS = (4, 8, 16, 32, 64, 128, 256)
_UNBOUNDED_ROWS = 1 << 40  # max_ggml_rows when no batch measured goes to the dense path
_PANEL_MARGIN = 0.95  # calibrate: the panel kernel takes a row count where it measured under 0.95x the block kernel
_STEP_ROWS = 8  # the block kernel's row tile: each weight block is unpacked once for up to 8 rows
_AMX_STEP_ROWS = 64  # the AMX kernel's: each dequantized tile serves up to 64 rows (4 tiles of 16)
# ... and the packed blocks' (the 16-bit VNNI kernel, _packs): one panel serves up to 256 rows. Offline decode-only
# steps of the default model on a 2-core Zen 4 (median of 3 x 64 steps, native step against the layer path on
# the dense bf16 copy past its 8-row crossover): 16 rows 28.2-29.9 ms against 33.9-34.4, 32 rows 41-49
# against 50-51, 64 rows 78-89 against 84-90 (benchmarks/README.md, "Packed blocks for the 16-bit VNNI kernel")
_PACKED_STEP_ROWS = 64
# The output head (a wide_out layer) stays on its kernels, whose logits are fp32, up to at least this many
# rows whatever the calibrated crossover: speculative verification (up to 2 requests x 7 rows) and small
# batches. On the dense path at bf16 its logits are bf16 and tie; verification then rejects drafts that the
# fp32 logits keep (55% of the code edit's drafts accepted against 84%, benchmarks/README.md, "What a
# verification row costs"), and calibration put the crossover anywhere from 1 to 64 rows on one host.
_HEAD_ROWS = 16
_STREAM_BYTES = 64 << 20  # calibration times layers until their blocks pass this (beyond the caches; at 16 MiB
# and 2 repetitions it took 0.02-0.09 s instead of 0.33-0.54 s, but put the crossover at 1-8 rows instead of
# 16-32 on the AMX Xeon, where the 64-row steps measured the AMX kernel ahead: the dense copy of 14 layers
# (50 MB at bf16) then fit in its 105 MiB L3, of 30 layers (107 MB) not)


def to_blocks(tensor: torch.Tensor, type_name: str) -> GGUFQuantized:
    """A dense (rows, k) tensor -> blocks of `type_name` by ggml's quantizer (f16/f32: a plain copy).
    K-quant rows that are not a multiple of 256 fall back to q8_0 (compute.requant_type_for)."""
    rows, k = tensor.shape
    t = requant_type_for(type_name, k)
    qtype = GGMLQuantizationType[t.upper()]
    src = np.ascontiguousarray(tensor.detach().to(torch.float32).numpy())
    if t in UNQUANTIZED_TYPES:
        data = src.astype(np.float16 if t == "f16" else np.float32)
        return GGUFQuantized(data.view(np.uint8).reshape(rows, -1), qtype, (rows, k))
    block, type_size = GGML_QUANT_SIZES[qtype]
    dst = np.empty((rows, k // block * type_size), dtype=np.uint8)
    ggml.quantize(int(qtype), src.ctypes.data, dst.ctypes.data, rows, k)
    return GGUFQuantized(dst, qtype, (rows, k))


def _blocks_bytes(layer: Linear) -> int:
    """Bytes of the layer's blocks, plain (ggml's matrices) or packed."""
    if layer.matmul is not None:
        return sum(w.nbytes for w in layer.matmul.weights)
    return sum(b.nbytes - 64 for b in layer.packed_blocks)


def _type_name(layer: Linear) -> str:
    """The first matrix's type, as ggml names it ("packed " before a packed one's)."""
    if layer.matmul is not None:
        return ggml.type_name(layer.matmul.weights[0].ggml_type)
    assert layer.block_mm is not None
    code = layer.block_mm[0][0]
    return ("packed " if code & block_matmul.PACKED else "") + ggml.type_name(code & ~block_matmul.PACKED)


class _Scratch:
    """One reused fp32 buffer for the dense path's tiles (grown on demand, never shrunk)."""

    def __init__(self) -> None:
        self.buf = torch.empty(0)

    def get(self, n: int) -> torch.Tensor:
        if self.buf.numel() < n:
            self.buf = torch.empty(n)
        return self.buf[:n]


_Q4_K = int(GGMLQuantizationType.Q4_K)
# types whose fused parts (gate | up) become separate ggml weights rather than one joined copy: ggml repacks
# them (MXFP4 on x86), and a joined copy before repacking doubled the load's peak for gpt-oss's experts
_REPACKED_APART = {int(GGMLQuantizationType.MXFP4)}


def q4k_plain_here() -> bool:
    """Q4_K matrices stay in the file's blocks for our K-quant kernel on this CPU, rather than in ggml's
    repacked layout: everywhere but on AVX-512 without AMX. A 7B Q4_K_M file's decode, one stream, 2 cores:
    on an AMX Xeon our kernel 1.21-1.30x llama-server (ggml's repacked kernel ~1.0x); on a Zen 4 EPYC
    (AVX-512 executed in 256-bit halves, VNNI, no AMX) ggml's repacked kernel 6.6-7.5 tok/s against our
    5.6-5.9, alternating (benchmarks/README.md, "8-bit VNNI panels"), its 8-bit products at twice the rate of
    our 16-bit ones where the loads no longer bound them. The prompt then reads the repacked blocks back
    (slower than plain at a few tens of rows, still past llama-server's there)."""
    flags = cpu_flags()
    return "avx512f" not in flags or {"amx_bf16", "amx_tile"} <= flags


class GGUFLinearMethod(LinearMethod):
    name = "gguf"
    keeps_blocks = True  # the embedding keeps its blocks too (layers/embedding.py)

    def __init__(self, requant_type: str | None = None, repack: bool | None = None,
                 dense_copy: torch.dtype | None = None, vnni_pack: bool | None = None) -> None:
        if not ggml.available():
            raise RuntimeError(f"the gguf linear method needs ggml's kernels: {ggml.unavailable_reason()}")
        self.requant_type = requant_type
        self.repack = os.environ.get("TOKENMILL_GGML_REPACK", "1") != "0" if repack is None else repack
        env = os.environ.get("TOKENMILL_GGML_MAX_ROWS")
        self.max_ggml_rows: int = int(env) if env else 16  # until calibrate() measures it
        self._fixed_rows = env is not None
        self._step_rows = 0  # calibrate(): decode steps the native step keeps on the blocks past the crossover
        # plain blocks take the fp32 panel kernel from this many rows (None: never); calibrate() measures it,
        # TOKENMILL_PANEL_MIN_ROWS fixes it (TOKENMILL_PANEL_MATMUL=0 turns the kernel off)
        panel_env = os.environ.get("TOKENMILL_PANEL_MIN_ROWS")
        self.panel_min_rows: int | None = (int(panel_env) if panel_env and block_matmul.panel_available()
                                           else None)
        self._fixed_panel = panel_env is not None
        # calibrate(): past the crossover, layers with repacked Q4_K take ggml's plain-block kernel (read back a
        # tile at a time: _plain) rather than dequantize + F.linear, where that measured faster
        self._big_plain = False
        self._scratch = _Scratch()
        self.dense_copy = dense_copy  # keep each matrix dense at this dtype too (None: no copy)
        # pack the blocks the 16-bit VNNI kernel takes (_packs): as the platform decided (compute.vnni_pack), or,
        # on a method built alone, where bf16 compute is implied by a bf16 dense copy
        self.vnni_pack = vnni_packs(dense_copy == torch.bfloat16, block_matmul.vnni_bits()) \
            if vnni_pack is None else vnni_pack
        self._onednn = dense_copy == torch.bfloat16 and can_prepack_here()  # the copy prepacked for oneDNN
        self._amx = block_matmul.amx_available()  # plain blocks multiplied on AMX when x is bf16
        # at bf16 the panel kernel in integers on AVX512-VNNI (vnni_matmul.cpp) instead of fp32: x to 16 bits,
        # or 8 where asked for; none on AMX (block_matmul.vnni_bits)
        self._vnni = block_matmul.vnni_bits()
        # ... and the K-quants' big batches (TOKENMILL_AMX_K_QUANTS=0: ggml's kernels, as before)
        self._amx_k_quants = os.environ.get("TOKENMILL_AMX_K_QUANTS") != "0"
        # Q4_K left in the file's blocks for our kernel rather than repacked for ggml's (_keeps_plain) where
        # that measured faster (q4k_plain_here); TOKENMILL_Q4K_PLAIN=1 keeps every K-quant plain, 0 repacks
        # what ggml can repack, as before our kernel
        env = os.environ.get("TOKENMILL_Q4K_PLAIN")
        self._k_plain = env != "0"
        self._q4k_plain = env == "1" or (env is None and q4k_plain_here())
        self._threads = ThreadChooser(1)  # one thread or all for each ggml call (layers/thread_choice.py)

    @property
    def max_step_rows(self) -> int:
        """Rows up to which a decode-only step may run as one native call (models/native_decode.py), whose
        matmuls are the block kernels. That is at least the per-matmul crossover, and after calibrate() at
        least _STEP_ROWS: one native call also saves the per-op dispatch of the layer path, which a
        one-matmul calibration does not see (AMX, bf16, crossover measured at 1 row: n-gram speculation at
        C=1 0.95-0.98x with verification on the layer path, 1.24-1.29x with it in the native step;
        benchmarks/README.md, "AMX again"); on the AMX kernel (bf16 on AMX), at least _AMX_STEP_ROWS; on packed
        blocks (the 16-bit VNNI kernel), at least _PACKED_STEP_ROWS."""
        return max(self.max_ggml_rows, self._step_rows)

    @property
    def threads(self) -> ThreadChooser:
        """The chooser for torch's current team size (a new one when the team changed)."""
        team = torch.get_num_threads()
        if self._threads.team != team:
            self._threads = ThreadChooser(team)
        return self._threads

    # -- weights ---------------------------------------------------------------------------------------
    def create_weights(self, layer: Linear) -> None:
        layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        layer.weight.weight_loader = functools.partial(self.load, layer)  # type: ignore[attr-defined]
        layer.weight.shard_ids = list(layer.shards)  # type: ignore[attr-defined]
        layer.blocks = {}  # shard (or None) -> GGUFQuantized, until finish_loading
        layer.matmul = None
        layer.block_mm = None  # [(ggml type, blocks' address, rows, first output column)] for block_matmul
        layer.dense = []  # (GgmlWeight it can dequantize, first output column) for the dense path
        layer.packed = None  # the dense copy (out, in), prepacked for oneDNN at bf16, when the method keeps one
        layer.plain = None

    def to_blocks(self, tensor: torch.Tensor | GGUFQuantized) -> GGUFQuantized:
        """A checkpoint matrix as ggml blocks: quantized ones as they are; dense ones at the requant type
        (or f32 without one)."""
        if isinstance(tensor, GGUFQuantized):
            return tensor
        return to_blocks(tensor, self.requant_type or "f32")

    def load(self, layer: Linear, param: nn.Parameter, tensor: torch.Tensor | GGUFQuantized,  # type: ignore[override]
             shard: str | None) -> None:
        if param is not layer.weight:  # the bias: dense, like any method's
            assert isinstance(tensor, torch.Tensor)
            super().load(layer, param, tensor, shard)
            return
        a, b = layer.shard_rows(shard)
        want = (b - a, layer.in_features)
        if tuple(tensor.shape) != want:
            raise ValueError(f"weight shard {shard!r} has shape {tuple(tensor.shape)}, expected {want}")
        layer.blocks[shard] = self.to_blocks(tensor)

    def finish_loading(self, layer: Linear) -> None:
        # shard by shard (q, k, v), or the whole fused tensor at once (None) as a checkpoint that stores it so
        order = [None] if None in layer.blocks or not layer.shards else list(layer.shards)
        if set(order) != set(layer.blocks):
            raise ValueError(f"linear layer lacks shards {set(order) - set(layer.blocks)}"
                             if set(layer.blocks) <= set(order) else
                             f"linear layer got its whole tensor and shards {set(layer.blocks) - {None}}")
        groups: list[tuple[int, list[GGUFQuantized]]] = []  # (first output column, adjacent parts of one type)
        for shard in order:
            part, (a, _) = layer.blocks[shard], layer.shard_rows(shard)
            if groups and groups[-1][1][-1].ggml_type == part.ggml_type:
                groups[-1][1].append(part)
            else:
                groups.append((a, [part]))
        copy = None if self.dense_copy is None else torch.empty(layer.out_features, layer.in_features,
                                                                  dtype=self.dense_copy)
        pack = self._packs(layer, groups)
        weights, offsets = [], []
        packed: list[tuple[int, int, int, int]] = []
        if self.repack:  # parts that ggml repacks stay apart, each repacked from the file's pages: joined first,
            # gpt-oss-20b's load peaked at 15.3 GiB against 12.1 (benchmarks/README.md, "gpt-oss-20b's shapes")
            split: list[tuple[int, list[GGUFQuantized]]] = []
            for offset, parts in groups:
                if len(parts) > 1 and int(parts[0].ggml_type) in _REPACKED_APART:
                    split += [(r0, [p]) for p, r0 in
                              zip(parts, itertools.accumulate((q.shape[0] for q in parts), initial=offset))]
                else:
                    split.append((offset, parts))
            groups = split
        for offset, parts in groups:
            if copy is not None:
                for p, r0 in zip(parts, itertools.accumulate((q.shape[0] for q in parts), initial=offset)):
                    self._dequantize_into(p, copy[r0: r0 + p.shape[0]])
            if pack:
                packed.append(self._pack(layer, offset, parts))
                continue
            if len(parts) == 1:
                data, release = parts[0].data, parts[0].release
            else:  # join the rows: a copy, after which the file's pages can go
                data = np.concatenate([p.data for p in parts], axis=0)
                for p in parts:
                    p.release()
                release = nothing
            n = sum(p.shape[0] for p in parts)
            qtype = int(parts[0].ggml_type)
            repack = self.repack and not self._keeps_plain(qtype)
            w = ggml.GgmlWeight(qtype, layer.in_features, n, data.ctypes.data, repack, data)
            if w.repacked:
                release()
            if w.dequantizable:  # plain blocks (not F32: ggml has no f32 to_float), or repacked Q4_K read back
                layer.dense.append((w, offset))
            weights.append(w)
            offsets.append(offset)
        layer.blocks = {}
        if copy is not None:
            layer.packed = prepack(copy) if self._onednn else copy
        if pack:  # no plain blocks kept (nor ggml's matrices): every path but the dense copy's reads the packed ones
            layer.block_mm = packed
            return
        layer.matmul = ggml.GgmlMatmul(weights, offsets, layer.out_features)
        # the big-batch path on the blocks (_plain): for repacked Q4_K (read back a tile at a time), and on AMX
        # for the K-quants its kernel takes
        amx_k = [self._amx_k_quant(w) for w in weights]
        # plain K-quant blocks kept for our kernel: ggml's plain-block kernel is one big-batch path for them
        kept = [not w.repacked and self._keeps_plain(w.ggml_type) for w in weights]
        if any(w.plain_matmul for w in weights) or any(amx_k) or any(kept):
            layer.plain = [(w, off, None if w.plain_matmul else ggml.GgmlMatmul([w], [off], layer.out_features), amx)
                           for w, off, amx in zip(weights, offsets, amx_k)]
        layer.dense_ok = len(layer.dense) == len(weights)
        # plain Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K blocks: our multi-row kernels (native/block_matmul.cpp,
        # kquant_matmul.cpp) instead of ggml's
        layer.block_mm = [(w.ggml_type, w.data_ptr, w.n, off) for w, off in zip(weights, offsets)] \
            if block_matmul.available() and all(not w.repacked and block_matmul.supports(w.ggml_type)
                                                for w in weights) else None
        # the AMX kernel from AMX_MIN_ROWS rows for Q4_0 / Q4_1 / Q8_0; K-quants stay on the block kernel up to
        # the crossover and take the AMX kernel past it (_plain): its K-quant dequantization made it ~6 GB/s at
        # 1-16 rows of 7B shapes, the block kernel 21 GB/s at one row, 10 at four, 6 at eight
        # (benchmarks/experiments/kquant_vs_ggml.py)
        layer.block_amx = self._amx and layer.block_mm is not None and all(
            block_matmul.amx_supports(w.n) and w.ggml_type not in block_matmul.AMX_K_TYPES for w in weights)

    def _packs(self, layer: Linear, groups: list[tuple[int, list[GGUFQuantized]]]) -> bool:
        """The layer's blocks go into the VNNI kernels' packed layout (native/vnni_matmul.cpp, tm_vnni_pack)
        instead of staying plain: where the platform packs (self.vnni_pack: bf16 compute where the 16-bit VNNI
        panel is the bf16 panel, with the dense copy or without it; without it the packed blocks take every
        batch), for a matrix of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL blocks in parts of
        whole 16-row groups, the output layer's included (a tied embedding then gathers its rows from the packed
        blocks: VocabEmbedding.share_packed_head), but not a mixture of experts' Q5_0 / Q5_1 / IQ4_NL (the
        one-call MoE path, moe_parts, multiplies those on ggml). Q5_0 / Q5_1 / IQ4_NL (the Q4_K / Q5_K / Q3_K
        stand-ins of a K-quant file where rows are not a multiple of 256: most of Gemma 3 270M's and 1B's
        matrices) otherwise go to ggml's kernel; packed Q5, at one row 1.8-2.7x its speed, at 4-8 rows 3.8-5.4x
        (on a 2-core Zen 4, benchmarks/README.md, "Q5_0 and Q5_1 packed"). The packed blocks are the file's bytes
        reordered so that the kernel reads 16 rows' blocks with plain loads where the plain ones take gathers
        (Q4_1, Q5_1 the same bytes; Q4_0, IQ4_NL +11%, Q5_0 +9%, Q8_0 +6%: compute.VNNI_PACKED_PIECE, counted by the
        memory plan), up to 32 rows without a panel: on a 2-core Zen 4 the
        default model's matrices at 1-32 rows 1.07-7x the prepacked bf16 copy (0.8-1.0x past 64), and 1.4-2.7x
        the block kernel at any rows (benchmarks/README.md, "Packed blocks for the 16-bit VNNI kernel").
        The output layer packed: on the default model's (49152, 576) Q8_0 head 1.9x its plain blocks at one
        row, 1.8x at 7, 1.7x at 16 (benchmarks/README.md, "The output layer packed too").
        TOKENMILL_VNNI_PACK=0: plain; TOKENMILL_VNNI_PACK_HEAD=0: all but the output layer's packed."""
        if not self.vnni_pack or not block_matmul.available():
            return False
        if layer.wide_out and os.environ.get("TOKENMILL_VNNI_PACK_HEAD") == "0":  # A/B runs (the plan counts it packed)
            return False
        for _, parts in groups:
            if any(int(p.ggml_type) not in block_matmul.PACK_TYPES for p in parts):
                return False
            # an expert's Q5_0 / Q5_1 stays ggml's: the MoE one-call path (moe_parts) multiplies those
            if layer.expert and any(int(p.ggml_type) not in block_matmul.PANEL_TYPES for p in parts):
                return False
            if any(p.shape[0] % block_matmul.PACK_ROWS for p in parts[:-1]):
                return False
        return True

    def _pack(self, layer: Linear, offset: int, parts: list[GGUFQuantized]) -> tuple[int, int, int, int]:
        """Adjacent parts of one type, their rows from output column `offset`, into one packed matrix (kept on
        the layer); the parts' pages are released -> its block_mm entry."""
        qtype, k = int(parts[0].ggml_type), layer.in_features
        n = sum(p.shape[0] for p in parts)
        nbytes = block_matmul.packed_bytes(qtype, n, k)
        buf = np.empty(nbytes + 64, dtype=np.uint8)
        start = -buf.ctypes.data % 64
        at = buf.ctypes.data + start
        for p in parts:
            data = np.ascontiguousarray(p.data)  # (a view of the file's pages: no copy)
            block_matmul.pack(qtype, data.ctypes.data, p.shape[0], k, at)
            at += block_matmul.packed_bytes(qtype, p.shape[0], k)  # whole 16-row groups but the last part's
            p.release()
        layer.packed_blocks.append(buf)
        return (block_matmul.PACKED | qtype, buf.ctypes.data + start, n, offset)

    def _keeps_plain(self, ggml_type: int) -> bool:
        """Leave a matrix of this type in the file's blocks rather than ggml's repacked layout (Q4_K) where our
        block kernel multiplies it: kquant_matmul.cpp took a 7B file's matrices at one row at 21-22 GB/s
        against 14-17 for ggml's kernels, repacked Q4_K included, and 2x at two rows; ggml's repacked kernel
        is the faster at 4-16 rows (1.05-1.75x), where the AMX kernel (bf16 on AMX) or the calibrated big-batch
        path takes over. The prompt's big batches lose nothing: they read repacked Q4_K back into these
        blocks anyway (at fp32 without the AMX kernel a 7B file's 128-token prompt took 4.2 s plain against
        6.0 repacked, decode 229 against 264 ms a token; benchmarks/README.md). TOKENMILL_Q4K_PLAIN=0: repack."""
        return ((self._q4k_plain if ggml_type == _Q4_K else self._k_plain) and ggml_type in block_matmul.AMX_K_TYPES
                and block_matmul.available() and block_matmul.supports(ggml_type))

    def _dequantize_into(self, part: GGUFQuantized, out: torch.Tensor) -> None:
        """part's rows as `out`'s values (out: (rows, k) at the copy's dtype), a tile at a time."""
        rows, k = part.shape
        if part.ggml_type == GGMLQuantizationType.F32:
            out.copy_(torch.from_numpy(np.array(part.data.view(np.float32).reshape(rows, k))))
            return
        ggml_type, data_ptr, row_bytes = int(part.ggml_type), part.data.ctypes.data, ggml.row_size(part.ggml_type, k)
        for r0, tile in self._tiles(rows, k, 1, lambda r0, r, out, t: ggml.dequantize(
                ggml_type, data_ptr + r0 * row_bytes, r, k, out, t)):
            out[r0: r0 + tile.shape[0]].copy_(tile)

    def _tiles(self, rows: int, k: int, align: int,
               dequantize: Callable[[int, int, int, int], None]) -> Iterator[tuple[int, torch.Tensor]]:
        """A matrix of `rows` rows dequantized a tile at a time into the one scratch buffer -> (first row,
        (r, k) fp32 tile), each valid until the next is made. dequantize(r0, r, out_ptr, threads) fills a
        tile; tiles start at multiples of `align` rows (8 for ggml's repacked Q4_K)."""
        step = max(align, _TILE_ELEMS // k // align * align)
        for r0 in range(0, rows, step):
            r = min(step, rows - r0)
            tile = self._scratch.get(r * k).view(r, k)
            dequantize(r0, r, tile.data_ptr(), torch.get_num_threads())
            yield r0, tile

    def weight_bytes(self, out_features: int, in_features: int, dtype_bytes: int) -> int:
        raise NotImplementedError("the gguf method's bytes depend on the file's types (memory_plan.make_plan)")

    # -- compute ---------------------------------------------------------------------------------------
    @staticmethod
    def uses_amx(layer: Linear, dtype: torch.dtype, rows: int | None = None) -> bool:
        """The layer's block kernel at this compute dtype is the AMX one (bf16 only: it rounds x to bf16),
        for a call of `rows` rows (at least block_matmul.AMX_MIN_ROWS; None: for the calls that have them,
        the rule the native step and the grouped call apply in C++)."""
        return layer.block_amx and dtype == torch.bfloat16 and (rows is None or rows >= block_matmul.AMX_MIN_ROWS)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x (M, in) -> (M, out) at x's dtype; fp32 for a wide_out layer (the head) unless on the dense path."""
        m = x.shape[0]
        rows = max(self.max_ggml_rows, _HEAD_ROWS) if layer.wide_out else self.max_ggml_rows
        if m > rows and self._big_plain and layer.plain is not None and layer.packed is None:
            y = self._plain(layer, x)
        elif m > rows and (layer.dense_ok or layer.packed is not None):
            y = self._dense(layer, x)
        else:
            y = self._ggml(layer, x)
        return y if layer.bias is None else y + layer.bias

    def vnni_panel(self, dtype: torch.dtype) -> int:
        """The bits x is rounded to in the panel kernel at this compute dtype: 16 or 8 on a VNNI one
        (vnni_matmul.cpp), at bf16 only, where x is rounded anyway; 0: the fp32 panel kernel (at fp32, or
        without VNNI). The default model teacher-forced against the fp32 reference, every prompt row on the
        panel: top-1 0.958 at 8 bits, against the dense bf16 copy's 0.975; the fp32 panel 1.000 at fp32."""
        return self._vnni if dtype == torch.bfloat16 else 0

    def _ggml(self, layer: Linear, x: torch.Tensor, panel: bool | None = None) -> torch.Tensor:
        """ggml's kernels, or ours on plain blocks: the block kernel, the AMX one, or from panel_min_rows rows
        the fp32 panel kernel (panel: force it on or off, for calibrate)."""
        assert layer.matmul is not None or layer.block_mm is not None, "finish_loading() builds the matmul"
        m, mm, k, n_out = x.shape[0], layer.matmul, layer.in_features, layer.out_features
        amx = layer.block_mm is not None and self.uses_amx(layer, x.dtype, m)
        if amx and not layer.wide_out and layer.block_mm is not None:  # (the last for mypy: amx implies it)
            # bf16 rows in and out of the AMX kernel: no fp32 copies (the same bits as rounding them)
            xb = x.contiguous()
            y = torch.empty(m, n_out, dtype=torch.bfloat16)
            xp, yp = xb.data_ptr(), y.data_ptr()
            for qtype, wp, n, off in layer.block_mm:
                self.threads.run(m * k * n, lambda t: block_matmul.matmul(qtype, wp, n, k, xp, m, yp + 2 * off,
                                                                          n_out, t, amx=True, bf16=True))
            return y
        x32 = x.to(torch.float32).contiguous()
        y = torch.empty(m, n_out, dtype=torch.float32)
        if m:
            xp, yp = x32.data_ptr(), y.data_ptr()
            if layer.block_mm is not None:
                # (amx here: a wide-output layer at bf16, on the kernel's fp32 entry, the same products unrounded)
                if panel is None:
                    panel = not amx and self.panel_min_rows is not None and m >= self.panel_min_rows
                vnni = self.vnni_panel(x.dtype) if panel else 0
                for qtype, wp, n, off in layer.block_mm:
                    self.threads.run(m * k * n, lambda t: block_matmul.matmul(qtype, wp, n, k, xp, m, yp + 4 * off,
                                                                              n_out, t, amx=amx, panel=panel,
                                                                              vnni=vnni))
            else:
                self.threads.run(m * k * n_out, lambda t: mm(xp, m, yp, t))
        return y if x.dtype == torch.float32 or layer.wide_out else y.to(x.dtype)

    def _dense(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.packed is not None:  # the dense copy
            xc = x.to(self.dense_copy)
            y = packed_linear(xc, layer.packed) if self._onednn else F.linear(xc, layer.packed)
            return y.to(x.dtype)
        y = x.new_empty(x.shape[0], layer.out_features)
        for w, offset in layer.dense:
            for r0, tile in self._tiles(w.n, layer.in_features, w.row_align, w.dequantize_rows):
                c0 = offset + r0
                y[:, c0 : c0 + tile.shape[0]] = F.linear(x, tile if x.dtype == torch.float32 else tile.to(x.dtype))
        return y

    def _amx_k_quant(self, w: ggml.GgmlWeight) -> bool:
        """A Q4_K, Q5_K or Q6_K weight whose big batches the AMX kernel multiplies at bf16 (_plain): its plain
        blocks, or repacked Q4_K read back a tile at a time."""
        return (self._amx and self._amx_k_quants and w.ggml_type in block_matmul.AMX_K_TYPES
                and block_matmul.amx_supports(w.n) and w.k % 256 == 0 and (not w.repacked or w.plain_matmul))

    def _plain(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x (M, in) -> (M, out) at x's dtype on the blocks: at bf16 on AMX a K-quant weight on the AMX kernel;
        otherwise ggml's plain-block kernels, a repacked Q4_K weight read back into the file's blocks a tile at a
        time (into the dense path's scratch), any other as it is."""
        assert layer.plain is not None
        x32 = x.to(torch.float32).contiguous()
        m, t = x.shape[0], torch.get_num_threads()
        y = torch.empty(m, layer.out_features, dtype=torch.float32)
        xp, yp = x32.data_ptr(), y.data_ptr()
        for w, off, one, amx in layer.plain:
            if amx and x.dtype == torch.bfloat16:
                self._amx_blocks(w, off, xp, m, yp, layer.out_features, t)
            elif one is not None:  # plain blocks, or a layout ggml multiplies itself
                one(xp, m, yp, t)
            else:
                scratch = self._scratch.get(_TILE_ELEMS)
                w.matmul_plain(xp, m, yp, layer.out_features, off, scratch.data_ptr(), 4 * scratch.numel(), t)
        return y if x.dtype == torch.float32 or layer.wide_out else y.to(x.dtype)

    @staticmethod
    def _amx_k_layer(layer: Linear, dtype: torch.dtype) -> bool:
        """Some of the layer's big batches at `dtype` run on the AMX kernel's K-quant path (_plain)."""
        return dtype == torch.bfloat16 and layer.plain is not None and any(amx for *_, amx in layer.plain)

    def _amx_blocks(self, w: ggml.GgmlWeight, off: int, xp: int, m: int, yp: int, ldy: int, t: int) -> None:
        """y[:, off : off + w.n] (fp32, rows ldy apart) = x (m, k) fp32 . W^T on the AMX kernel: plain blocks in
        place, repacked Q4_K read back into the scratch buffer a tile of rows (a multiple of 16) at a time."""
        if not w.repacked:
            block_matmul.matmul(w.ggml_type, w.data_ptr, w.n, w.k, xp, m, yp + 4 * off, ldy, t, amx=True)
            return
        row = ggml.row_size(w.ggml_type, w.k)
        step = max(16, 4 * _TILE_ELEMS // row // 16 * 16)
        scratch = self._scratch.get(-(-step * row // 4))
        for r0 in range(0, w.n, step):
            rows = min(step, w.n - r0)
            w.read_plain_blocks(r0, rows, scratch.data_ptr(), t)
            block_matmul.matmul(w.ggml_type, scratch.data_ptr(), rows, w.k, xp, m, yp + 4 * (off + r0), ldy, t,
                                amx=True)

    def apply_grouped(self, layers: list[Linear], x: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
        """Layer i on the next counts[i] rows of x (sum(counts), in), all in one ggml call per weight (a mixture
        of experts: one, or one per fused part kept apart, gpt-oss's gate and up) -> (sum(counts), out) at x's
        dtype, each layer's bias added to its rows. None where some layer with rows would not take ggml's path
        alone (more rows than the crossover on plain blocks), or the layers differ in their parts or biases:
        the caller then runs them one by one. Each layer computes exactly what apply() would."""
        parts: tuple[tuple[int, int], ...] | None = None  # (rows, first output column) of each weight
        for lyr, n in zip(layers, counts):
            mm = lyr.matmul
            if mm is None or (lyr.bias is None) != (layers[0].bias is None):
                return None
            if n > self.max_ggml_rows and (lyr.dense_ok or lyr.packed is not None):
                return None
            mine = tuple((w.n, off) for w, off in zip(mm.weights, mm.offsets))
            if parts is None:
                parts = mine
            elif mine != parts:
                return None
        assert parts is not None
        k, n_out = layers[0].in_features, layers[0].out_features
        if sum(n for n, _ in parts) != n_out:
            return None
        x32 = x.to(torch.float32).contiguous()
        y = torch.empty(x.shape[0], n_out, dtype=torch.float32)
        # the kernel apply() would pick for each layer: the block kernel for all (one type, one weight), or
        # ggml's for all; a mix runs one by one
        blocks = [b[0] for lyr in layers if (b := lyr.block_mm) is not None and len(b) == 1]
        mine_all = len(blocks) == len(layers) and len({b[0] for b in blocks}) == 1
        if not mine_all and any(lyr.block_mm is not None for lyr in layers):
            return None
        amx = {self.uses_amx(lyr, x.dtype) for lyr in layers}
        if len(amx) > 1:  # some on the AMX kernel, some not: one by one
            return None
        if x.shape[0]:
            xp, yp = x32.data_ptr(), y.data_ptr()
            if mine_all:
                qtype, ptrs = blocks[0][0], [b[1] for b in blocks]
                on_amx = amx.pop()
                self.threads.run(x.shape[0] * k * n_out, lambda t: block_matmul.matmul_grouped(
                    qtype, ptrs, counts, n_out, k, xp, yp, t, amx=on_amx))
            elif len(parts) == 1:
                weights = [lyr.matmul.weights[0] for lyr in layers]  # type: ignore[union-attr]
                self.threads.run(x.shape[0] * k * n_out,
                                 lambda t: ggml.matmul_grouped(weights, counts, xp, k, yp, n_out, t))
            else:  # each part (gate, up) grouped on its own, into its columns
                for j, (nj, off) in enumerate(parts):
                    part = [lyr.matmul.weights[j] for lyr in layers]  # type: ignore[union-attr]
                    yj = torch.empty(x.shape[0], nj, dtype=torch.float32)
                    yjp = yj.data_ptr()
                    self.threads.run(x.shape[0] * k * nj,
                                     lambda t: ggml.matmul_grouped(part, counts, xp, k, yjp, nj, t))
                    y[:, off : off + nj] = yj
        out = y if x.dtype == torch.float32 else y.to(x.dtype)
        if layers[0].bias is not None:  # as apply(): the bias added at x's dtype, each layer to its own rows
            start = 0
            for lyr, n in zip(layers, counts):
                assert lyr.bias is not None  # (all have one: checked above)
                out[start : start + n] += lyr.bias
                start += n
        return out

    def moe_parts(self, gate_up: list[Linear], down: list[Linear],
                  n_parts: int | None = None) -> tuple[tuple[int, int], ...] | None:
        """Whether a mixture of experts (every expert's gate_up and down layer) can run as one ggml call
        (apply_moe): every matrix on ggml's kernels (not our block kernels), gate|up one weight or two halves
        alike in every expert (n_parts of them, if given), the down one weight, biases on all or none -> gate_up's
        (rows, first output column) of each part, or None (and the layers left as they were).

        Where this CPU gives Q4_K to ggml's repacked kernel (q4k_plain_here: AVX-512 without AMX), K-quant
        matrices our block kernel would take (Q6_K downs beside Q4_K gates in a Q4_K_M file) go to ggml's plain
        kernel instead when the call takes the layer, so that the whole layer is one call: on a 2-core Zen 4 the
        LFM2-8B-A1B-shaped Q4_K_M file's one-stream step took 39.9 ms against 44.0 grouped, where with those
        downs left on the block kernel (12 of 22 layers one call) 42.4 against 43.6 (one process, alternating,
        before the routing moved into the call)."""
        def on_ggml(lyr: Linear) -> bool:
            if lyr.matmul is None:
                return False
            return lyr.block_mm is None or (not self._q4k_plain and not lyr.block_amx and all(
                q in block_matmul.AMX_K_TYPES for q, *_ in lyr.block_mm))

        has_bias = gate_up[0].bias is not None
        inter = down[0].in_features
        parts: tuple[tuple[int, int], ...] = ()
        for g, dn in zip(gate_up, down):
            if not (on_ggml(g) and on_ggml(dn)) or (g.bias is None) == has_bias or (dn.bias is None) == has_bias:
                return None
            mine = tuple((w.n, off) for w, off in zip(g.matmul.weights, g.matmul.offsets))
            if mine not in (((2 * inter, 0),), ((inter, 0), (inter, inter))) or (parts and mine != parts):
                return None
            if len(dn.matmul.weights) != 1:
                return None
            parts = mine
        if not parts or (n_parts is not None and len(parts) != n_parts):
            return None
        for lyr in gate_up + down:
            lyr.block_mm = None
        return parts

    def moe_layer(self, router: Linear, gate_up: list[Linear], down: list[Linear], parts: tuple[tuple[int, int], ...],
                  sigmoid: bool, sel_bias: torch.Tensor | None, renorm: bool, scaling: float, top_k: int, act: int,
                  alpha: float = 0.0, limit: float = 0.0,
                  shared: tuple[Linear, Linear] | None = None) -> ggml.MoeLayer:
        """The native layer apply_moe runs (experts as moe_parts accepted them, `parts` its answer): the router
        inside it where it is one ggml weight, else the caller's logits; sel_bias (E,) fp32 contiguous, kept alive
        by the caller; a shared expert's (gate_up, down) inside it where moe_parts accepts it with as many gate|up
        parts as the experts have, else none (the caller adds it)."""
        rm = router.matmul
        on_ggml = rm is not None and router.block_mm is None and len(rm.weights) == 1
        gub = dnb = None
        if gate_up[0].bias is not None:
            gub = [[b.data_ptr() + 4 * off for _, off in parts] for b in (_bias32(g) for g in gate_up)]
            dnb = [_bias32(dn).data_ptr() for dn in down]
        sh = None
        if shared is not None and shared[0].bias is None and self.moe_parts([shared[0]], [shared[1]], len(parts)):
            sh = (shared[0].matmul.weights, shared[1].matmul.weights[0])
        return ggml.MoeLayer(rm.weights[0] if on_ggml else None,
                             _bias32(router).data_ptr() if on_ggml and router.bias is not None else 0, sigmoid,
                             0 if sel_bias is None else sel_bias.data_ptr(), renorm, scaling, top_k,
                             [g.matmul.weights for g in gate_up], [dn.matmul.weights[0] for dn in down], act, alpha,
                             limit, gub, dnb, sh)

    def moe_max_rows(self, dense_ok: bool) -> int:
        """The most rows an expert takes in apply_moe's call: the crossover where its matrices can go dense."""
        return self.max_ggml_rows if dense_ok else _UNBOUNDED_ROWS

    def apply_moe(self, layer: ggml.MoeLayer, h: torch.Tensor, logits: torch.Tensor | None, dense_ok: bool,
                  shared: bool = False, shared_weight: torch.Tensor | None = None) -> torch.Tensor | None:
        """A mixture-of-experts layer in one ggml call (ggml_shim.cpp tm_moe: the router, the routing, the rows
        gathered, each chosen expert's gate|up, activation and down in one graph and thread team, each token's
        weighted sum, with `shared` the shared expert's result added (times shared_weight (T,), or 1); all in
        fp32): h (T, in) -> (T, out) at h's dtype; logits (T, E) where the layer has no router of its own. None
        (nothing computed) where an expert would get more rows than the crossover and its matrices can go dense
        (dense_ok): the caller then runs the grouped matmuls."""
        T = h.shape[0]
        x32 = h.to(torch.float32).contiguous()
        lg = None if logits is None else logits.to(torch.float32).contiguous()
        sw = None if shared_weight is None else shared_weight.to(torch.float32).contiguous()
        y = torch.empty(T, layer.d, dtype=torch.float32)
        if T:
            max_rows = self.moe_max_rows(dense_ok)
            xp, yp = x32.data_ptr(), y.data_ptr()
            lp, sp = 0 if lg is None else lg.data_ptr(), 0 if sw is None else sw.data_ptr()
            done: list[bool] = []
            self.threads.run(T * layer.macs_per_token,
                             lambda t: done.append(layer.call(xp, T, yp, lp, max_rows, t, shared, sp)))
            if not done[0]:
                return None
        return y if h.dtype == torch.float32 else y.to(h.dtype)

    # -- the crossover -----------------------------------------------------------------------------------
    def calibrate(self, layers: list[Linear], dtype: torch.dtype) -> None:
        """Measure, on the layer shape with the most bytes in all, from how many rows the dense path (the copy,
        or dequantize + F.linear) beats the block kernels; log the figures. Skipped when TOKENMILL_GGML_MAX_ROWS fixes it or no layer can go dense."""
        dense = [lyr for lyr in layers if getattr(lyr, "dense_ok", False) or lyr.packed is not None]
        if self._fixed_rows or not dense:
            # (no dense copy, and every matrix packed or repacked: the packed ones take the 16-bit VNNI kernel at
            # any rows, so decode-only steps stay in the native step up to its packed-row limit)
            if any(lyr.packed_blocks for lyr in layers):
                self._step_rows = _PACKED_STEP_ROWS
            log.info("gguf matmuls: ggml's kernels up to %d rows%s", self.max_ggml_rows,
                     " (TOKENMILL_GGML_MAX_ROWS)" if self._fixed_rows else
                     " (every matrix packed for the VNNI kernel or repacked for ggml's: never dense)")
            return
        shapes: dict[tuple[int, int], list[Linear]] = {}
        for lyr in dense:
            shapes.setdefault((lyr.out_features, lyr.in_features), []).append(lyr)
        # the decoder's shapes (those that repeat), not a one-off output head: a 262144-row head (Gemma 3)
        # took minutes to time and says little about the layers that do most of the work
        repeated = {k: v for k, v in shapes.items() if len(v) > 1} or shapes
        same = max(repeated.items(), key=lambda kv: len(kv[1]) * kv[0][0] * kv[0][1])[1]  # most bytes
        layer = same[0]
        # the layers of that shape in turn, as a step runs them, until their blocks pass _STREAM_BYTES: their
        # weights then stream from memory as in a step, where one layer timed over and over sits in the
        # cache (which flattered the dense copy: at 4 rows on AMX one (3072, 576) layer timed 0.17-0.37 ms
        # either way, while 30 of them took 13.5-16.5 ms dense against 8.6-10.8 on the AMX kernel)
        group, nbytes = [], 0
        for lyr in same:
            group.append(lyr)
            nbytes += _blocks_bytes(lyr)
            if nbytes >= _STREAM_BYTES:
                break
        # a layer with repacked Q4_K and no dense copy has two big-batch paths: dequantize + F.linear, and ggml's
        # plain-block kernel on the blocks read back (_plain); both are timed, the faster at the crossover kept
        plain = layer.plain is not None and layer.packed is None
        # plain blocks at fp32 (not on AMX) have two kernels of ours: the integer block kernel and the fp32 panel
        # kernel; both are timed, and the panel takes over from the first row count where it is the faster.
        # Once it has won twice the block kernel is not timed again (it stays near one rate as rows grow, the
        # panel's rises: 90 against 115 -> 185 GFLOPS from 32 to 512 rows on a 2-core AVX2 EPYC)
        timing_panel = (not self._fixed_panel and layer.block_mm is not None and block_matmul.panel_available()
                        and not self.uses_amx(layer, dtype)
                        and all(p[0] in block_matmul.PANEL_TYPES for p in layer.block_mm))
        key = self._calibration_key(layer, len(group), dtype, plain, timing_panel)
        found = CALIBRATIONS.get(key)
        if found is None:
            crossover, where = self._measure_crossover(layer, group, dtype, plain, timing_panel), "measured"
            CALIBRATIONS.put(key, crossover)
        else:
            crossover, where = found
        self.max_ggml_rows, self._big_plain = crossover.max_ggml_rows, crossover.big_plain
        if timing_panel:
            self.panel_min_rows = crossover.panel_min_rows
        # decode-only steps in the native step up to the kernel's row tile, whatever the per-matmul figure:
        # on AMX at 48 and 64 rows (crossover 32) the native step on the AMX kernel took 88-95 / 108-147 ms
        # against the layer path's 109-113 / 128-154 on the dense copy (offline decode, interleaved)
        packed = layer.block_mm is not None and any(p[0] & block_matmul.PACKED for p in layer.block_mm)
        self._step_rows = (_AMX_STEP_ROWS if self.uses_amx(layer, dtype) else
                           _PACKED_STEP_ROWS if packed else _STEP_ROWS)
        bounded = self.max_ggml_rows < _UNBOUNDED_ROWS
        amx_k = self._amx_k_layer(layer, dtype)
        above = ("the dense copy" if layer.packed is not None else
                 "dequantize + F.linear" if not self._big_plain else
                 "the AMX kernel on the K-quant blocks (in place, or repacked Q4_K read back)" if amx_k else
                 "ggml's plain-block kernel (in place, or repacked Q4_K read back)")
        log.info("gguf matmuls: block kernels %s%s, decode-only steps %s in one native call; %s (%s on %d "
                 "(%d, %d) %s layers, %s%s/dense%s: %s)",
                 f"up to {self.max_ggml_rows} rows" if bounded else "at any number of rows",
                 f" (the {f'{v}-bit VNNI' if (v := self.vnni_panel(dtype)) else 'fp32'} panel kernel from {self.panel_min_rows})"
                 if self.panel_min_rows is not None else "",
                 f"up to {self.max_step_rows} rows" if self.max_step_rows < _UNBOUNDED_ROWS else "of any size",
                 f"{above} above" if bounded else f"{above} never measured faster", where,
                 len(group), layer.out_features, layer.in_features,
                 _type_name(layer),
                 ("amx_matmul" if self.uses_amx(layer, dtype) else "block_matmul") if layer.block_mm is not None
                 else "ggml", ("/" + block_matmul.panel_entry(self.vnni_panel(dtype))[3:]) if timing_panel else "",
                 "/plain" if plain else "",
                 ", ".join(crossover.figures))

    def _calibration_key(self, layer: Linear, num_layers: int, dtype: torch.dtype, plain: bool,
                         timing_panel: bool) -> str:
        """Everything the crossover measurement depends on but the timings: the CPU, the layer shape and type,
        the kernels in play, the threads, the TOKENMILL_* settings. Equal keys measure the same thing."""
        settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("TOKENMILL_") and k != CACHE_ENV)
        return json.dumps([
            cpu_model(), sorted(cpu_flags()), layer.out_features, layer.in_features,
            _type_name(layer), num_layers, str(dtype), plain,
            layer.packed is not None, bool(getattr(layer, "dense_ok", False)), layer.block_mm is not None,
            self.uses_amx(layer, dtype), timing_panel, self.vnni_panel(dtype), self.panel_min_rows if self._fixed_panel else None,
            self._amx_k_layer(layer, dtype),
            str(self.dense_copy), self.repack, torch.get_num_threads(), settings])

    def _measure_crossover(self, layer: Linear, group: list[Linear], dtype: torch.dtype, plain: bool,
                           timing_panel: bool) -> Crossover:
        """Time the block kernels against the dense path on `group` at growing row counts (see calibrate), the
        kernels on all of torch's threads as the dense path is: a new size class starts on one thread, and
        the thread chooser's first probes fell inside the timings (at 4 rows on the AMX Xeon the AMX kernel
        timed 8.18 ms against the dense copy's 6.03 in one start, 4.41-4.73 against 5.87-6.18 in others, so
        the crossover came out at 1 row or at 32)."""
        chooser, self._threads = self._threads, _AllThreads(torch.get_num_threads())
        try:
            return self._time_crossover(layer, group, dtype, plain, timing_panel)
        finally:
            self._threads = chooser

    def _time_crossover(self, layer: Linear, group: list[Linear], dtype: torch.dtype, plain: bool,
                        timing_panel: bool) -> Crossover:
        panel_min_rows: int | None = None
        big_plain = False
        figures, best, panel_wins, panel_last = [], 0, 0, False
        for m in _CALIBRATION_ROWS:
            x = torch.randn(m, layer.in_features, dtype=dtype)
            # from 128 rows every path is bound by arithmetic, not by the weights' bytes: a quarter of the group
            # says the same in a quarter of the time (the load spends ~1 s less here)
            g = group if m < 128 else group[: max(1, len(group) // 4)]
            t_g = (_best_time(lambda: [self._ggml(lyr, x, panel=False) for lyr in g]) if panel_wins < 2
                   else float("inf"))
            t_q = _best_time(lambda: [self._ggml(lyr, x, panel=True) for lyr in g]) if timing_panel else float("inf")
            t_d = _best_time(lambda: [self._dense(lyr, x) for lyr in g])
            t_p = _best_time(lambda: [self._plain(lyr, x) for lyr in g]) if plain else float("inf")
            figures.append(f"M={m} " + "/".join(f"{t * 1e3:.2f}" if t < float("inf") else "-" for t in
                                                (t_g, *((t_q,) if timing_panel else ()), t_d,
                                                 *((t_p,) if plain else ()))) + " ms")
            # the panel counts as faster only by a margin: timings this short wander by a few percent, and a
            # wandering tie at 8 rows (12.58 against 12.80 ms once, where the panel is 0.6-0.8x the block
            # kernel) would hand it every small decode step
            panel_faster = t_q < _PANEL_MARGIN * t_g
            if panel_faster:
                panel_wins += 1
                if panel_min_rows is None:
                    panel_min_rows = m
            if min(t_d, t_p) < min(t_g, t_q):
                big_plain = t_p < t_d
                break
            best, panel_last = m, panel_faster
        else:
            if panel_last:  # the panel beat the dense path at the most rows timed: it keeps every size above
                best = _UNBOUNDED_ROWS
        return Crossover(max(best, 1), panel_min_rows, big_plain, figures)


def _bias32(layer: Linear) -> torch.Tensor:
    """The layer's bias in fp32, contiguous (made once: the native calls read it by pointer)."""
    b = getattr(layer, "bias32", None)
    if b is None:
        assert layer.bias is not None
        b = layer.bias.detach().to(torch.float32).contiguous()
        setattr(layer, "bias32", b)
    return b


class _AllThreads(ThreadChooser):
    """A thread chooser that always takes the whole team, untimed (calibration's)."""

    def run(self, macs: int, call: Callable[[int], None]) -> None:
        call(self.team)


def _best_time(fn: object, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best
