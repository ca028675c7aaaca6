"""ctypes binding of tokenmill's ggml shim (ggml_shim.cpp): quantized matmuls, row gathers, the quantizer.

`lib()` returns the loaded library, or None when ggml is not built here (the reason is logged once and kept
in `unavailable_reason()`). Nothing here imports torch: callers pass raw pointers (tensor.data_ptr(),
ndarray.ctypes.data).

ggml type ids are gguf.GGMLQuantizationType's values (the same enum).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import numpy as np

from tokenmill.native.compile import NativeBuildError

log = logging.getLogger("tokenmill.native")

_c_i64p = ctypes.POINTER(ctypes.c_int64)
_reason: str | None = None


def _declare(lib: ctypes.CDLL) -> None:
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    sigs: dict[str, tuple[object, list[object]]] = {
        "tm_row_size": (sz, [i32, i64]),
        "tm_block_size": (i64, [i32]),
        "tm_type_name": (ctypes.c_char_p, [i32]),
        "tm_weight_create": (vp, [i32, i64, i64, vp, i32]),
        "tm_weight_nbytes": (sz, [vp]),
        "tm_weight_layout": (ctypes.c_char_p, [vp]),
        "tm_weight_repacked": (i32, [vp]),
        "tm_weight_free": (None, [vp]),
        "tm_weight_row_align": (i32, [vp]),
        "tm_weight_dequantize": (i32, [vp, i64, i64, vp, i32]),
        "tm_weight_plain_blocks": (i32, [vp, i64, i64, vp, i32]),
        "tm_weight_matmul_plain": (i32, [vp, vp, i64, vp, i64, i64, vp, sz, i32]),
        "tm_matmul": (i32, [ctypes.POINTER(vp), _c_i64p, i32, vp, i64, i64, vp, i64, i32]),
        "tm_matmul_grouped": (i32, [ctypes.POINTER(vp), i32, _c_i64p, _c_i64p, vp, i64, vp, i64, i32]),
        "tm_moe": (i32, [vp, vp, vp, i32, vp, i32, ctypes.c_float, i32, i32, ctypes.POINTER(vp), i32,
                         ctypes.POINTER(vp), ctypes.POINTER(vp), ctypes.POINTER(vp), ctypes.POINTER(vp), vp, vp, vp,
                         i64, i64, vp, i64, i32, ctypes.c_float, ctypes.c_float, i64, i32]),
        "tm_get_rows": (None, [i32, vp, i64, vp, i64, vp]),
        "tm_dequantize": (None, [i32, vp, i64, i64, vp, i32]),
        "tm_quantize": (sz, [i32, vp, vp, i64, i64]),
        "tm_quantize_requires_imatrix": (i32, [i32]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


@functools.cache
def lib() -> ctypes.CDLL | None:
    """The shim, built (without downloading) if the ggml sdist is cached; None if not available here.
    TOKENMILL_GGML=0 turns it off (GGUF weights are then dequantized)."""
    global _reason
    if os.environ.get("TOKENMILL_GGML", "1") == "0":
        _reason = "TOKENMILL_GGML=0"
        return None
    try:
        from tokenmill.native.ggml_build import shim_library

        path = shim_library(download=False)
        handle = ctypes.CDLL(str(path))
    except (NativeBuildError, OSError) as e:
        _reason = str(e)
        log.warning("ggml kernels unavailable, GGUF weights will be dequantized: %s", e)
        return None
    _declare(handle)
    return handle


def available() -> bool:
    return lib() is not None


def unavailable_reason() -> str | None:
    lib()
    return _reason


def _lib() -> ctypes.CDLL:
    h = lib()
    if h is None:
        raise NativeBuildError(f"ggml is not available: {_reason}")
    return h


def row_size(ggml_type: int, k: int) -> int:
    return int(_lib().tm_row_size(ggml_type, k))


def quantize(ggml_type: int, src_ptr: int, dst_ptr: int, rows: int, k: int) -> int:
    """ggml's quantizer: (rows, k) fp32 at src_ptr -> dst_ptr (rows * row_size bytes). Returns bytes."""
    if k % int(_lib().tm_block_size(ggml_type)):
        raise ValueError(f"rows of {k} are not a multiple of the {type_name(ggml_type)} block "
                         f"({_lib().tm_block_size(ggml_type)})")
    return int(_lib().tm_quantize(ggml_type, src_ptr, dst_ptr, rows, k))


def requires_imatrix(ggml_type: int) -> bool:
    return bool(_lib().tm_quantize_requires_imatrix(ggml_type))


def type_name(ggml_type: int) -> str:
    return _lib().tm_type_name(ggml_type).decode()


_F32 = 0  # GGML_TYPE_F32: ggml has no to_float for it (a null pointer), so it cannot be "dequantized"


def _check_not_f32(ggml_type: int) -> None:
    if ggml_type == _F32:
        raise ValueError("ggml cannot dequantize F32 rows (they are the values already)")


def get_rows(ggml_type: int, data_ptr: int, k: int, ids_ptr: int, n: int, out_ptr: int) -> None:
    """Dequantize rows ids[0..n) (int64 at ids_ptr) of a (rows, k) matrix into out (n, k) fp32 (not F32)."""
    _check_not_f32(ggml_type)
    _lib().tm_get_rows(ggml_type, data_ptr, k, ids_ptr, n, out_ptr)


def dequantize(ggml_type: int, data_ptr: int, rows: int, k: int, out_ptr: int, n_threads: int = 1) -> None:
    """(rows, k) blocks at data_ptr -> (rows, k) fp32 at out_ptr (not F32)."""
    _check_not_f32(ggml_type)
    _lib().tm_dequantize(ggml_type, data_ptr, rows, k, out_ptr, n_threads)


class GgmlWeight:
    """One (n, k) matrix of a ggml type, at `data_ptr` (zero copy: `keepalive` must hold the memory) or, with
    repack, in ggml's repacked copy (AMX layouts only with TOKENMILL_GGML_AMX=1: see ggml_shim.cpp). Freed
    with the object."""

    def __init__(self, ggml_type: int, k: int, n: int, data_ptr: int, repack: bool, keepalive: object) -> None:
        self._lib = _lib()
        self.ggml_type, self.k, self.n = ggml_type, k, n
        flags = int(repack) | (2 if os.environ.get("TOKENMILL_GGML_AMX") == "1" else 0)
        h = self._lib.tm_weight_create(ggml_type, k, n, data_ptr, flags)
        if not h:
            raise ValueError(f"ggml cannot hold a ({n}, {k}) {type_name(ggml_type)} weight")
        self.handle: int = h
        self.repacked = bool(self._lib.tm_weight_repacked(h))
        self.layout: str = self._lib.tm_weight_layout(h).decode()
        self.nbytes = int(self._lib.tm_weight_nbytes(h))
        self.data_ptr = data_ptr if not self.repacked else 0  # the plain blocks, if kept
        self._keepalive = None if self.repacked else keepalive
        # dequantize_rows takes spans of row_align rows: 1 on plain blocks, 8 on ggml's repacked Q4_K (which
        # the shim reads back); 0 where it cannot read the layout (other repacked ones, F32)
        self.row_align = int(self._lib.tm_weight_row_align(h))

    @property
    def dequantizable(self) -> bool:
        return self.row_align > 0

    def dequantize_rows(self, r0: int, rows: int, out_ptr: int, n_threads: int = 1) -> None:
        """Rows [r0, r0 + rows) -> (rows, k) fp32 at out_ptr (r0 and rows multiples of row_align)."""
        if self._lib.tm_weight_dequantize(self.handle, r0, rows, out_ptr, n_threads):
            raise ValueError(f"cannot dequantize rows {r0}..{r0 + rows} of a {type_name(self.ggml_type)} weight "
                             f"in layout {self.layout!r}")

    def plain_blocks(self, r0: int, rows: int) -> np.ndarray:
        """Rows [r0, r0 + rows) as the file's plain blocks, (rows, row_size) uint8 (read back from a repacked
        layout where the shim can)."""
        out = np.empty((rows, row_size(self.ggml_type, self.k)), dtype=np.uint8)
        self.read_plain_blocks(r0, rows, out.ctypes.data)
        return out

    def read_plain_blocks(self, r0: int, rows: int, out_ptr: int, n_threads: int = 1) -> None:
        """Rows [r0, r0 + rows) as the file's plain blocks into out_ptr (rows * row_size bytes); for a
        repacked Q4_K weight r0 and rows multiples of 8 (row_align)."""
        if self._lib.tm_weight_plain_blocks(self.handle, r0, rows, out_ptr, n_threads):
            raise ValueError(f"cannot read plain blocks back from layout {self.layout!r}")

    @property
    def plain_matmul(self) -> bool:
        """A repacked layout that matmul_plain can multiply on ggml's plain-block kernel (read back a tile at a
        time): repacked Q4_K."""
        return self.repacked and self.row_align == 8

    def matmul_plain(self, x_ptr: int, m: int, y_ptr: int, ldy: int, col0: int, scratch_ptr: int,
                     scratch_bytes: int, n_threads: int) -> None:
        """y[:, col0 : col0 + n] = x (m, k) fp32 . W^T on ggml's plain-block kernel, the rows read back from the
        repacked layout into `scratch` a tile at a time (only where plain_matmul). y: (m, ldy) fp32."""
        rc = self._lib.tm_weight_matmul_plain(self.handle, x_ptr, m, y_ptr, ldy, col0, scratch_ptr, scratch_bytes,
                                              n_threads)
        if rc:
            raise RuntimeError(f"ggml plain-block matmul of a {self.layout!r} weight failed (status {rc})")

    def __del__(self) -> None:
        h, self.handle = getattr(self, "handle", 0), 0
        if h:
            self._lib.tm_weight_free(h)


class GgmlMatmul:
    """The weights of one (possibly fused) linear layer, multiplied in one call: out columns
    [offset_i, offset_i + n_i) come from weight i."""

    def __init__(self, weights: list[GgmlWeight], offsets: list[int], out_features: int) -> None:
        self.weights, self.offsets, self.out_features = weights, list(offsets), out_features
        self.k = weights[0].k
        self._handles = (ctypes.c_void_p * len(weights))(*(w.handle for w in weights))
        self._offsets = (ctypes.c_int64 * len(weights))(*offsets)
        self._n = len(weights)
        self._fn = _lib().tm_matmul

    def __call__(self, x_ptr: int, m: int, y_ptr: int, n_threads: int) -> None:
        """x (m, k) fp32 contiguous -> y (m, out_features) fp32 contiguous."""
        rc = self._fn(self._handles, self._offsets, self._n, x_ptr, m, self.k, y_ptr, self.out_features, n_threads)
        if rc:
            raise RuntimeError(f"ggml matmul failed (status {rc})")


def matmul_grouped(weights: list[GgmlWeight], counts: list[int], x_ptr: int, k: int, y_ptr: int, n: int,
                   n_threads: int) -> None:
    """Weight g times the next counts[g] rows of x (sum(counts), k) fp32 -> the same rows of y (., n) fp32,
    all in one call; every weight is (n, k)."""
    g = len(weights)
    starts = [0] * g
    for i in range(1, g):
        starts[i] = starts[i - 1] + counts[i - 1]
    handles = (ctypes.c_void_p * g)(*(w.handle for w in weights))
    rc = _lib().tm_matmul_grouped(handles, g, (ctypes.c_int64 * g)(*starts), (ctypes.c_int64 * g)(*counts), x_ptr,
                                  k, y_ptr, n, n_threads)
    if rc:
        raise RuntimeError(f"ggml grouped matmul failed (status {rc})")


ACT_SILU, ACT_SWIGLU_OAI = 0, 1  # tm_moe's activations: silu(gate) * up; gpt-oss's clamped SwiGLU


class MoeLayer:
    """A mixture-of-experts layer for tm_moe (ggml_shim.cpp): the router (a weight, with its fp32 bias; or None:
    the caller passes the logits), the routing rule, and every expert's weights (gate_up[e]: one (2I, k) weight,
    gate rows then up rows, or [gate, up]; down[e] (d, I); biases as fp32 pointers, a list per expert, or None),
    and a shared expert's (shared: (gate_up parts as the experts', down), no biases; or None), the foreign arrays
    built once. call() runs a step's tokens through the whole layer in one foreign call."""

    def __init__(self, router: GgmlWeight | None, router_bias: int, sigmoid: bool, sel_bias: int, renorm: bool,
                 scaling: float, top_k: int, gate_up: list[list[GgmlWeight]], down: list[GgmlWeight], act: int,
                 alpha: float = 0.0, limit: float = 0.0, gate_up_bias: list[list[int]] | None = None,
                 down_bias: list[int] | None = None,
                 shared: tuple[list[GgmlWeight], GgmlWeight] | None = None) -> None:
        vp = ctypes.c_void_p
        e, n_gu = len(down), len(gate_up[0])
        if shared is not None and len(shared[0]) != n_gu:
            raise ValueError("the shared expert's gate|up must come in the experts' parts")
        self._keep = (router, gate_up, down, shared)  # the weights outlive the arrays of their handles
        self._shared = (None, None) if shared is None else ((vp * n_gu)(*(w.handle for w in shared[0])),
                                                            shared[1].handle)
        self.has_shared = shared is not None
        self._args = (None if router is None else router.handle, router_bias or None)
        self._rule = (1 if sigmoid else 0, sel_bias or None, int(renorm), scaling, top_k, e)
        self._experts = ((vp * (e * n_gu))(*(w.handle for ws in gate_up for w in ws)), n_gu,
                         (vp * e)(*(w.handle for w in down)),
                         None if gate_up_bias is None else (vp * (e * n_gu))(*(p for ps in gate_up_bias for p in ps)),
                         None if down_bias is None else (vp * e)(*down_bias))
        self.k, self.d = gate_up[0][0].k, down[0].n
        self._act = (act, alpha, limit)
        self.has_router = router is not None
        self.macs_per_token = top_k * self.k * (sum(w.n for w in gate_up[0]) + down[0].k)
        if shared is not None:
            self.macs_per_token += self.k * (sum(w.n for w in shared[0]) + shared[1].k)

    def step_fields(self) -> dict[str, object]:
        """The layer as decode_step.TmMoe's fields (the native decode step calls tm_moe with them), the router
        inside and a shared expert, if any, always inside; the arrays stay this object's."""
        scoring, sel, renorm, scaling, top_k, e = self._rule
        gu, n_gu, dn, gub, dnb = self._experts
        act, alpha, limit = self._act
        return dict(router=self._args[0], router_bias=self._args[1], scoring=scoring, renorm=renorm, top_k=top_k,
                    n_experts=e, n_gu=n_gu, act=act, scaling=scaling, alpha=alpha, limit=limit, sel_bias=sel,
                    gate_up=ctypes.cast(gu, ctypes.c_void_p), down=ctypes.cast(dn, ctypes.c_void_p),
                    gu_bias=None if gub is None else ctypes.cast(gub, ctypes.c_void_p),
                    down_bias=None if dnb is None else ctypes.cast(dnb, ctypes.c_void_p),
                    shared_gu=None if self._shared[0] is None else ctypes.cast(self._shared[0], ctypes.c_void_p),
                    shared_down=self._shared[1])

    def call(self, x_ptr: int, n_tokens: int, out_ptr: int, logits_ptr: int, max_rows: int, n_threads: int,
             shared: bool = False, shared_weight_ptr: int = 0) -> bool:
        """x (n_tokens, k) fp32 -> out (n_tokens, d) fp32 (logits_ptr: (n_tokens, experts) fp32, read where the
        layer has no router weight); with `shared`, the shared expert's result added, times shared_weight_ptr's
        (n_tokens,) fp32 (0: times 1). False: an expert got more than max_rows rows (nothing written)."""
        sh = self._shared if shared else (None, None)
        rc = _lib().tm_moe(*self._args, logits_ptr or None, *self._rule, *self._experts, *sh, shared_weight_ptr or None,
                           x_ptr, n_tokens, self.k, out_ptr, self.d, *self._act, max_rows, n_threads)
        if rc == 3:
            return False
        if rc:
            raise RuntimeError(f"ggml mixture-of-experts call failed (status {rc})")
        return True
