"""ctypes binding to block_matmul.cpp: x (M, K) fp32 times a GGUF matrix kept in its Q4_0 / Q4_1 / Q8_0
blocks, fp32 activations (see the C++ header for the layout and the invariants).

Built with g++ on first use and cached (compile.py), like kernels.cpp; `available()` is False when it
cannot be built, or with TOKENMILL_BLOCK_MATMUL=0, and the caller then uses ggml's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

from tokenmill.native.compile import NativeBuildError, build_library

log = logging.getLogger("tokenmill.native")

SOURCE = Path(__file__).with_name("block_matmul.cpp")
FLAGS = ("-fopenmp", "-ffp-contract=off")
ABI = 2
ENV_SWITCH = "TOKENMILL_BLOCK_MATMUL"
_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def library(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The loaded library, built on first use (tests pass -DTM_PORTABLE for the plain C++ path); None,
    logged, when it cannot be built or loaded."""
    try:
        path = build_library("tokenmill_block_matmul", [SOURCE], flags)
        lib = ctypes.CDLL(str(path))
        if lib.tm_block_matmul_abi() != ABI:
            raise NativeBuildError(f"{path} answers ABI {lib.tm_block_matmul_abi()}, expected {ABI}")
        lib.tm_block_matmul.argtypes = [_I32, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _I32]
        lib.tm_block_matmul_supports.argtypes = [_I32]
        lib.tm_block_matmul_grouped.argtypes = [_I32, _P, _I64, _P, _P, _I64, _I64, _P, _I64, _P, _I32]
    except (NativeBuildError, OSError, AttributeError) as e:
        log.warning("block matmul kernel unavailable, ggml's kernels multiply every GGUF matrix: %s", e)
        return None
    return lib


def available() -> bool:
    return os.environ.get(ENV_SWITCH) != "0" and library() is not None


def supports(ggml_type: int) -> bool:
    lib = library()
    return lib is not None and bool(lib.tm_block_matmul_supports(ggml_type))


def matmul(ggml_type: int, w_ptr: int, n: int, k: int, x_ptr: int, m: int, y_ptr: int, ldy: int,
           threads: int, lib: ctypes.CDLL | None = None) -> None:
    """y[:, :n] (rows ldy apart) = x (m, k) fp32 contiguous . W^T, W (n, k) in blocks at w_ptr."""
    lib = lib or library()
    assert lib is not None
    rc = lib.tm_block_matmul(ggml_type, w_ptr, n, k, x_ptr, k, m, y_ptr, ldy, threads)
    if rc:
        raise RuntimeError(f"block matmul failed (status {rc})")


def matmul_grouped(ggml_type: int, w_ptrs: list[int], counts: list[int], n: int, k: int, x_ptr: int, y_ptr: int,
                   threads: int) -> None:
    """Weight g (n, k) times the next counts[g] rows of x (sum(counts), k) fp32 contiguous -> the same rows
    of y (sum(counts), n) fp32, in one call; each group's rows are exactly what matmul() gives them."""
    lib = library()
    assert lib is not None
    g = len(w_ptrs)
    starts = [0] * g
    for i in range(1, g):
        starts[i] = starts[i - 1] + counts[i - 1]
    rc = lib.tm_block_matmul_grouped(ggml_type, (ctypes.c_void_p * g)(*w_ptrs), g, (ctypes.c_int64 * g)(*starts),
                                     (ctypes.c_int64 * g)(*counts), n, k, x_ptr, sum(counts), y_ptr, threads)
    if rc:
        raise RuntimeError(f"grouped block matmul failed (status {rc})")
