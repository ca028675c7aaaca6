"""ctypes bindings to kernels.cpp: fused decode kernels for CPU tensors (fp32 and bf16).

The library is built with g++ on first use (compile.py caches it per source, flags, compiler and CPU) and
loaded once. When it cannot be built (no g++, a compiler error) every caller takes its torch path, and the
log says so once. `TOKENMILL_NATIVE_KERNELS=0` forces the torch path (read at every call, so a test or an
A/B run can flip it).

Each wrapper checks what the kernel needs (CPU, fp32 or bf16, one dtype, unit stride in the last dim and
the layout stated) and returns None (or False) when the tensors do not fit, so the caller falls back to
torch; it never raises for an unsupported input. Results are written by the kernels; torch only allocates.
Threads: torch's count (`torch.get_num_threads()`), passed explicitly; libgomp is the one torch loaded
(same soname), so there is one OpenMP team.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from tokenmill.native.compile import NativeBuildError, build_library

log = logging.getLogger("tokenmill.native")

SOURCE = Path(__file__).with_name("kernels.cpp")
FLAGS = ("-fopenmp", "-ffp-contract=off")  # products rounded where the source says so (rotary is exact)
ABI_VERSION = 17  # 17: tm_add_layer_norm; 16: tm_sigmoid_f32; 15: tm_sigmoid_mul; 14: tm_gelu_tanh_and_mul, tm_head_rms_norm takes an offset; 13: tm_rotary gone; 12: tm_rotary_part; 11: tm_head_rms_norm; 10: tm_shortconv_decode; 9: tm_mamba2_decode; 8: tm_gdn_decode takes src_slots and dst_slots
# (was slots and fresh)
ENV_SWITCH = "TOKENMILL_NATIVE_KERNELS"
# decode attention cuts each context into partitions of this many positions, attended independently and
# merged (flash-decoding): a fixed size, so a sequence's result never depends on its batch or the threads
DEFAULT_PARTITION = 256

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}
_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "tm_add_rms_norm": [_I32, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _F32, _I32],
    "tm_add_layer_norm": [_I32, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _F32, _I32],
    # dtype, x, x_stride, rows, heads, hd, w, offset, eps, nthreads
    "tm_head_rms_norm": [_I32, _P, _I64, _I64, _I64, _I64, _P, _F32, _F32, _I32],
    "tm_silu_and_mul": [_I32, _P, _I64, _P, _I64, _I64, _I64, _I32],
    "tm_gelu_tanh_and_mul": [_I32, _P, _I64, _P, _I64, _I64, _I64, _I32],
    # dtype, x, x_stride, g, g_stride, g_head_stride, rows, heads, hd, nthreads
    "tm_sigmoid_mul": [_I32, _P, _I64, _P, _I64, _I64, _I64, _I64, _I64, _I32],
    "tm_sigmoid_f32": [_I32, _P, _I64, _P],
    # dtype, x, x_stride, heads, head_dim, rot, cos, ssin, tab_stride, rows, nthreads
    "tm_rotary_part": [_I32, _P, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _I32],
    "tm_argmax_rows": [_I32, _P, _I64, _I64, _I64, _P, _I32],
    "tm_paged_decode_attention": [_I32, _P, _I64, _P, _I64, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                  _F32, _F32, _I64, _I32],
    # ..., conv_w, conv_pool, ssm_pool, src_slots, dst_slots (int64 pointers), neg_a, dt_bias, norm_w, N, ...
    "tm_gdn_decode": [_I32, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64,
                      _I64, _I64, _I64, _I32, _F32, _I32],
    # ..., conv_w, conv_b, conv_pool, ssm_pool, src_slots, dst_slots, neg_a, dt_bias, D, norm_w, N, H, G, P, Ns, K, ...
    "tm_mamba2_decode": [_I32, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64,
                         _I64, _I64, _I64, _I64, _I64, _F32, _I32],
    # dtype, out, out_stride, bcx, bcx_stride, conv_w, conv_pool, src_slots, dst_slots, N, C, K, nthreads
    "tm_shortconv_decode": [_I32, _P, _I64, _P, _I64, _P, _P, _P, _P, _I64, _I64, _I64, _I32],
    "tm_paged_attention_rows": [_I32, _P, _I64, _P, _I64, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                _F32, _F32, _I64, _I32, _I64, _P],
}


@functools.cache
def library(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The loaded library, built on first use; None (logged once) when it cannot be built or loaded."""
    try:
        path = build_library("tokenmill_kernels", [SOURCE], flags)
        lib = ctypes.CDLL(str(path))
        if lib.tm_abi_version() != ABI_VERSION:
            raise NativeBuildError(f"{path} answers ABI {lib.tm_abi_version()}, expected {ABI_VERSION}")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
    except (NativeBuildError, OSError, AttributeError) as e:
        log.warning("native CPU kernels unavailable, using the torch path: %s", e)
        return None
    log.info("native CPU kernels loaded from %s", path)
    return lib


def is_enabled() -> bool:
    """The kernels are built and not switched off by TOKENMILL_NATIVE_KERNELS=0. Layers and backends ask
    once, when they are built; the wrappers below do not read the switch."""
    return os.environ.get(ENV_SWITCH) != "0" and library() is not None


def supports_dtype(dtype: torch.dtype) -> bool:
    return dtype in _DTYPE_CODE


# The checks below run on every call, so they use the cheap tensor attributes (is_cpu, stride(), dim())


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor | None:
    """x, residual (T, D), weight (D,): residual += x (in place), returns rmsnorm(residual) * weight as a new
    (T, D) tensor; without a residual, rmsnorm(x) * weight. None: not for the kernel (nothing written)."""
    return _add_norm("tm_add_rms_norm", x, residual, weight, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                   eps: float) -> torch.Tensor | None:
    """add_rms_norm with a LayerNorm without a bias (the mean taken out first: Cohere's)."""
    return _add_norm("tm_add_layer_norm", x, residual, weight, eps)


def _add_norm(entry: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
              eps: float) -> torch.Tensor | None:
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 2 or weight.dtype != x.dtype:
        return None
    T, D = x.shape
    xs = x.stride()
    if xs[1] != 1 or weight.shape != (D,) or weight.stride() != (1,):
        return None
    res_ptr, res_stride = None, 0
    if residual is not None:
        rs = residual.stride()
        if residual.dtype != x.dtype or residual.shape != x.shape or rs[1] != 1:
            return None
        res_ptr, res_stride = residual.data_ptr(), rs[0]
    out = torch.empty((T, D), dtype=x.dtype)
    rc = getattr(lib, entry)(code, out.data_ptr(), D, x.data_ptr(), xs[0], res_ptr, res_stride, weight.data_ptr(),
                             T, D, eps, torch.get_num_threads())
    return out if rc == 0 else None


def head_rms_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> bool:
    """x (T, heads, hd), unit stride in hd and heads hd apart (a view into a projection's rows is fine),
    weight (hd,): each head rmsnorm'ed in place, times weight (offset != 0: times offset + weight, in fp32).
    False: not for the kernel (nothing written)."""
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 3 or weight.dtype != x.dtype:
        return False
    T, H, hd = x.shape
    xs = x.stride()
    if xs[2] != 1 or (xs[1] != hd and H > 1) or weight.shape != (hd,) or weight.stride() != (1,):
        return False
    rc = lib.tm_head_rms_norm(code, x.data_ptr(), xs[0], T, H, hd, weight.data_ptr(), offset, eps,
                              torch.get_num_threads())
    return rc == 0


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """x (T, 2I) = gate | up -> silu(gate) * up (T, I), a new tensor. None: not for the kernel."""
    return _gated(x, "tm_silu_and_mul")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """x (T, 2I) = gate | up -> gelu(gate, tanh approximation) * up (T, I), a new tensor. None: not for the
    kernel."""
    return _gated(x, "tm_gelu_tanh_and_mul")


def sigmoid_mul_(x: torch.Tensor, g: torch.Tensor) -> bool:
    """x (T, H, hd), heads hd apart and unit stride in hd, times sigmoid(g) in place; g (T, H, hd) of x's dtype, unit
    stride in hd (heads any distance apart: Qwen3.5's gates sit between its q heads). False: not for the kernel
    (nothing written)."""
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 3 or g.dtype != x.dtype or g.shape != x.shape:
        return False
    T, H, hd = x.shape
    xs, gs = x.stride(), g.stride()
    if xs[2] != 1 or gs[2] != 1 or (xs[1] != hd and H > 1):
        return False
    rc = lib.tm_sigmoid_mul(code, x.data_ptr(), xs[0], g.data_ptr(), gs[0], gs[1], T, H, hd, torch.get_num_threads())
    return rc == 0


def sigmoid_f32(x: torch.Tensor) -> torch.Tensor | None:
    """x (any shape, contiguous, fp32 or bf16) -> sigmoid(x) flattened, (x.numel(),) fp32: what the native decode
    step computes for a gated shared expert's weights. None: not for the kernel."""
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or not x.is_contiguous():
        return None
    out = torch.empty(x.numel(), dtype=torch.float32)
    return out if lib.tm_sigmoid_f32(code, x.data_ptr(), x.numel(), out.data_ptr()) == 0 else None


def _gated(x: torch.Tensor, entry: str) -> torch.Tensor | None:
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 2:
        return None
    T, I2 = x.shape
    xs = x.stride()
    if xs[1] != 1 or I2 % 2:
        return None
    out = torch.empty((T, I2 // 2), dtype=x.dtype)
    rc = getattr(lib, entry)(code, out.data_ptr(), I2 // 2, x.data_ptr(), xs[0], T, I2 // 2, torch.get_num_threads())
    return out if rc == 0 else None


def argmax_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x (S, V) fp32 or bf16, unit stride in V -> (S,) int64: each row's first maximum, what
    x.max(dim=-1).indices gives. None: not for the kernel, or a row holds a NaN or an infinity (torch's
    answer is then the one to take)."""
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] == 0:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    rc = lib.tm_argmax_rows(code, x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr(),
                            torch.get_num_threads())
    if rc or (x.shape[0] and int(out.min()) < 0):
        return None
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> bool:
    """x (T, heads, hd) with its heads adjacent (stride hd), any row stride, rotated in place by the
    (T, 1, rot) or (T, rot) tables of rotary.py (rows contiguous): each head's leading rot dims (rot < hd: partial
    rotary). False: not for the kernel, x untouched."""
    code = _DTYPE_CODE.get(x.dtype)
    lib = library()
    if code is None or lib is None or not x.is_cpu or x.dim() != 3:
        return False
    T, H, hd = x.shape
    rot = cos.shape[-1]
    xs, cs = x.stride(), cos.stride()
    if xs[1] != hd or xs[2] != 1 or rot % 2 or rot > hd or cos.dtype != x.dtype or signed_sin.dtype != x.dtype:
        return False
    if cos.shape[0] != T or cos.numel() != T * rot or cs[-1] != 1 or signed_sin.shape != cos.shape or signed_sin.stride() != cs:
        return False
    rc = lib.tm_rotary_part(code, x.data_ptr(), xs[0], H, hd, rot, cos.data_ptr(), signed_sin.data_ptr(), cs[0], T,
                            torch.get_num_threads())
    return rc == 0


def paged_decode_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           partition: int = DEFAULT_PARTITION, starts: torch.Tensor | None = None,
                           softcap: float = 0.0, prefill_from: int | None = None,
                           sinks: torch.Tensor | None = None) -> bool:
    """One query token per sequence: q (B, nh, hd) (heads adjacent, any row stride) attends over positions
    [starts[b], context_lens[b]) (starts None: from 0; a sliding window's first key) of the paged caches k_cache, v_cache (num_blocks, block_size, nkv, hd; contiguous),
    found through block_tables (B, >= blocks needed) int64; the result goes into out (B, nh, hd), heads
    adjacent. GQA: query head h reads KV head h // (nh // nkv). softcap > 0: each (scaled) score s becomes
    softcap * tanh(s / softcap) before the softmax (Gemma 2). False: not for the kernel (nothing written).
    prefill_from: rows from this index on are prompt rows (None: none); at bf16 with AVX512_BF16 they attend
    on lane-wise tiles (query heads in the lanes: kernels.cpp, attend_range_lanes), 1.45-1.52x for a prompt's
    runs of 16 rows, with other last bits than a decode row of the same position gets.
    sinks (nh,) float32 contiguous: one more logit per query head in each softmax, selecting no value (gpt-oss).
    Each sequence's result depends on its own inputs (and whether it is a prompt row) only, not on the batch
    or the thread count."""
    code = _DTYPE_CODE.get(q.dtype)
    lib = library()
    if code is None or lib is None or not q.is_cpu or q.dim() != 3 or k_cache.dim() != 4:
        return False
    B, nh, hd = q.shape
    _, bs, nkv, khd = k_cache.shape
    qs, os_ = q.stride(), out.stride()
    if (khd != hd or qs[1] != hd or qs[2] != 1 or out.shape != q.shape or os_[1] != hd or os_[2] != 1
            or out.dtype != q.dtype or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype
            or v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        return False
    if (block_tables.dtype != torch.int64 or context_lens.dtype != torch.int64 or block_tables.dim() != 2
            or block_tables.stride(1) != 1 or block_tables.shape[0] != B or not context_lens.is_contiguous()
            or context_lens.shape != (B,)):
        return False
    if starts is not None and (starts.dtype != torch.int64 or starts.shape != (B,) or not starts.is_contiguous()):
        return False
    if sinks is not None and (sinks.dtype != torch.float32 or sinks.shape != (nh,) or not sinks.is_contiguous()
                              or not sinks.is_cpu):
        return False
    rc = lib.tm_paged_attention_rows(code, out.data_ptr(), os_[0], q.data_ptr(), qs[0], k_cache.data_ptr(),
                                     v_cache.data_ptr(), block_tables.data_ptr(), block_tables.stride(0),
                                     context_lens.data_ptr(), None if starts is None else starts.data_ptr(), B, nh,
                                     nkv, hd, bs, scale, softcap, partition, torch.get_num_threads(),
                                     B if prefill_from is None else prefill_from,
                                     None if sinks is None else sinks.data_ptr())
    return rc == 0


def gdn_decode(out: torch.Tensor, qkv: torch.Tensor, z: torch.Tensor, ba: torch.Tensor, conv_w: torch.Tensor,
               conv_pool: torch.Tensor, ssm_pool: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor,
               neg_a: torch.Tensor, dt_bias: torch.Tensor, norm_w: torch.Tensor, num_key_heads: int, tiled: bool,
               eps: float) -> bool:
    """A Gated DeltaNet layer's decode step between its projections (kernels.cpp, gdn_decode), N sequences:
    out (N, Hv dv) written; qkv (N, C), z (N, Hv dv), ba (N, 2 Hv: b | a) of out's dtype, unit stride in the
    last dim; conv_w (C, K), neg_a, dt_bias (Hv,), norm_w (dv,) float32; conv_pool (S, C, K - 1) and ssm_pool
    (S, Hv, dk, dv) float32 contiguous: sequence n's state read from slot src_slots[n] (-1: fresh, a zero state)
    and written to slot dst_slots[n] (in place when equal; otherwise the src slot is left unchanged), both (N,)
    int64 contiguous. The sequences run in parallel: no two write one slot, none reads a slot another writes.
    False: not for the kernel (nothing written)."""
    code = _DTYPE_CODE.get(out.dtype)
    lib = library()
    if code is None or lib is None or not out.is_cpu or out.dim() != 2:
        return False
    N = out.shape[0]
    S, Hv, dk, dv = ssm_pool.shape
    C, K = conv_w.shape
    if (any(t.dtype != out.dtype or t.dim() != 2 or t.shape[0] != N or t.stride(1) != 1 for t in (qkv, z, ba))
            or out.stride(1) != 1 or out.shape[1] != Hv * dv or z.shape[1] != Hv * dv or ba.shape[1] != 2 * Hv
            or qkv.shape[1] != C or C != 2 * num_key_heads * dk + Hv * dv
            or not _f32_ok(conv_w, conv_pool, ssm_pool, neg_a, dt_bias, norm_w)
            or conv_pool.shape != (S, C, K - 1) or neg_a.shape != (Hv,) or dt_bias.shape != (Hv,)
            or norm_w.shape != (dv,)
            or not _slots_ok(N, src_slots, dst_slots)):
        return False
    rc = lib.tm_gdn_decode(code, out.data_ptr(), out.stride(0), qkv.data_ptr(), qkv.stride(0), z.data_ptr(),
                           z.stride(0), ba.data_ptr(), ba.stride(0), conv_w.data_ptr(), conv_pool.data_ptr(),
                           ssm_pool.data_ptr(), src_slots.data_ptr(), dst_slots.data_ptr(), neg_a.data_ptr(),
                           dt_bias.data_ptr(), norm_w.data_ptr(), N, num_key_heads, Hv, dk, dv, K, int(tiled), eps, torch.get_num_threads())
    return rc == 0


def mamba2_decode(out: torch.Tensor, xbc: torch.Tensor, z: torch.Tensor, dt: torch.Tensor, conv_w: torch.Tensor,
                  conv_b: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, src_slots: torch.Tensor,
                  dst_slots: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor, skip: torch.Tensor,
                  norm_w: torch.Tensor, groups: int, eps: float) -> bool:
    """A Mamba2 layer's decode step between in_proj and out_proj (kernels.cpp, mamba2_decode), N sequences: out
    (N, I) written (I = H P, the gated norm's output); xbc (N, C) (C = I + 2 G Ns: x | B | C before the conv), z
    (N, I), dt (N, H) (before dt_bias) of out's dtype, unit stride in the last dim; conv_w (C, K), conv_b (C,),
    neg_a (= -exp(A_log)), dt_bias, skip (D) (H,), norm_w (I,) float32; conv_pool (S, C, K - 1) and ssm_pool
    (S, H, P, Ns) float32 contiguous; src_slots / dst_slots (N,) int64 contiguous as gdn_decode's (-1: fresh; in
    place when equal, otherwise the src slot left unchanged; no two sequences write one slot, none reads a slot
    another writes). False: not for the kernel (nothing written)."""
    code = _DTYPE_CODE.get(out.dtype)
    lib = library()
    if code is None or lib is None or not out.is_cpu or out.dim() != 2 or ssm_pool.dim() != 4 or conv_w.dim() != 2:
        return False
    N = out.shape[0]
    S, H, P, Ns = ssm_pool.shape
    C, K = conv_w.shape
    I = H * P
    if (groups <= 0 or H % groups
            or any(t.dtype != out.dtype or t.dim() != 2 or t.shape[0] != N or t.stride(1) != 1 for t in (xbc, z, dt))
            or out.stride(1) != 1 or out.shape[1] != I or z.shape[1] != I or dt.shape[1] != H
            or xbc.shape[1] != C or C != I + 2 * groups * Ns
            or not _f32_ok(conv_w, conv_b, conv_pool, ssm_pool, neg_a, dt_bias, skip, norm_w)
            or conv_pool.shape != (S, C, K - 1) or conv_b.shape != (C,) or neg_a.shape != (H,)
            or dt_bias.shape != (H,) or skip.shape != (H,) or norm_w.shape != (I,)
            or not _slots_ok(N, src_slots, dst_slots)):
        return False
    rc = lib.tm_mamba2_decode(code, out.data_ptr(), out.stride(0), xbc.data_ptr(), xbc.stride(0), z.data_ptr(),
                              z.stride(0), dt.data_ptr(), dt.stride(0), conv_w.data_ptr(), conv_b.data_ptr(),
                              conv_pool.data_ptr(), ssm_pool.data_ptr(), src_slots.data_ptr(), dst_slots.data_ptr(),
                              neg_a.data_ptr(), dt_bias.data_ptr(), skip.data_ptr(), norm_w.data_ptr(), N, H, groups,
                              P, Ns, K, eps, torch.get_num_threads())
    return rc == 0


def _f32_ok(*ts: torch.Tensor) -> bool:
    """Every tensor float32, contiguous, on the CPU (the recurrent kernels' weights and state pools)."""
    return all(t.dtype == torch.float32 and t.is_contiguous() and t.is_cpu for t in ts)


def _slots_ok(n: int, *ts: torch.Tensor) -> bool:
    """Every tensor an (n,) int64 contiguous CPU tensor (the recurrent kernels' src / dst slots)."""
    return all(t.dtype == torch.int64 and t.shape == (n,) and t.is_contiguous() and t.is_cpu for t in ts)


def shortconv_decode(out: torch.Tensor, bcx: torch.Tensor, conv_w: torch.Tensor, conv_pool: torch.Tensor,
                     src_slots: torch.Tensor, dst_slots: torch.Tensor) -> bool:
    """An LFM2 short conv layer's decode step between in_proj and out_proj (kernels.cpp, shortconv_decode), N
    sequences: out (N, C) = C * conv(B * x) written; bcx (N, 3C: B | C | x, in_proj's output) of out's dtype, unit
    stride in the last dim; conv_w (C, K) float32 contiguous; conv_pool (S, C, K - 1) float32 contiguous, each slot a
    sequence's last K - 1 values of B * x; src_slots / dst_slots (N,) int64 contiguous as gdn_decode's (-1: fresh; in
    place when equal, otherwise the src slot left unchanged; no two sequences write one slot, none reads a slot
    another writes). False: not for the kernel (nothing written)."""
    code = _DTYPE_CODE.get(out.dtype)
    lib = library()
    if code is None or lib is None or not out.is_cpu or out.dim() != 2 or conv_w.dim() != 2 or conv_pool.dim() != 3:
        return False
    N, C = out.shape
    K = conv_w.shape[1]
    if (out.stride(1) != 1 or bcx.dtype != out.dtype or bcx.dim() != 2 or bcx.shape != (N, 3 * C)
            or bcx.stride(1) != 1 or not bcx.is_cpu or C == 0 or K < 1
            or not _f32_ok(conv_w, conv_pool)
            or conv_w.shape != (C, K) or conv_pool.shape[1:] != (C, K - 1)
            or not _slots_ok(N, src_slots, dst_slots)):
        return False
    rc = lib.tm_shortconv_decode(code, out.data_ptr(), out.stride(0), bcx.data_ptr(), bcx.stride(0),
                                 conv_w.data_ptr(), conv_pool.data_ptr(), src_slots.data_ptr(), dst_slots.data_ptr(),
                                 N, C, K, torch.get_num_threads())
    return rc == 0
