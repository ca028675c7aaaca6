"""ctypes binding to block_matmul.cpp: x (M, K) fp32 times a GGUF matrix kept in its Q4_0 / Q4_1 / Q8_0
blocks, or Q4_K / Q5_K / Q6_K ones (kquant_matmul.cpp), fp32 activations (see the C++ headers for the layouts
and the invariants); and to amx_matmul.cpp,
the same product on Intel AMX at bf16 (weights dequantized to bf16 in registers, x rounded to bf16; Q4_K,
Q5_K and Q6_K blocks too), for
bf16 compute on a CPU that has the tile unit (`amx_available()`; TOKENMILL_AMX_MATMUL=0 turns it off); and to
panel_matmul.cpp, the same product at fp32 for batches of rows (weights dequantized into an L2-sized panel,
x unrounded; TOKENMILL_PANEL_MATMUL=0 turns it off); and to vnni_matmul.cpp, the panel product in integers
on AVX512-VNNI, x at 16 bits or 8 (vnni_bits; TOKENMILL_VNNI_MATMUL).

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
AMX_SOURCE = Path(__file__).with_name("amx_matmul.cpp")
PANEL_SOURCE = Path(__file__).with_name("panel_matmul.cpp")
KQUANT_SOURCE = Path(__file__).with_name("kquant_matmul.cpp")
VNNI_SOURCE = Path(__file__).with_name("vnni_matmul.cpp")
SOURCES = (SOURCE, AMX_SOURCE, PANEL_SOURCE, KQUANT_SOURCE, VNNI_SOURCE)  # one library (`python -m tokenmill.native.build`)
FLAGS = ("-fopenmp", "-ffp-contract=off")
ABI = 5
ENV_SWITCH = "TOKENMILL_BLOCK_MATMUL"
AMX_SWITCH = "TOKENMILL_AMX_MATMUL"
PANEL_SWITCH = "TOKENMILL_PANEL_MATMUL"
VNNI_SWITCH = "TOKENMILL_VNNI_MATMUL"
# Below this many rows the integer kernel's one pass over the blocks beats the AMX kernel's dequantization:
# 30 (3072, 576) Q4_1 layers at 1 row, 2 threads: 6.0-6.4 ms against 9.7-12.1 (AMX Xeon, 2026-12-03). The
# layer path (GGUFLinearMethod) and the native decode step both take it from here.
AMX_MIN_ROWS = 4
_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def library(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The loaded library, built on first use (tests pass -DTM_PORTABLE for the plain C++ path); None,
    logged, when it cannot be built or loaded."""
    try:
        path = build_library("tokenmill_block_matmul", SOURCES, flags)
        lib = ctypes.CDLL(str(path))
        if lib.tm_block_matmul_abi() != ABI:
            raise NativeBuildError(f"{path} answers ABI {lib.tm_block_matmul_abi()}, expected {ABI}")
        lib.tm_block_matmul.argtypes = [_I32, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _I32]
        lib.tm_block_matmul_supports.argtypes = [_I32]
        lib.tm_block_matmul_grouped.argtypes = [_I32, _P, _I64, _P, _P, _I64, _I64, _P, _I64, _P, _I32]
        lib.tm_amx_matmul.argtypes = lib.tm_block_matmul.argtypes
        lib.tm_amx_matmul_bf16.argtypes = lib.tm_block_matmul.argtypes
        lib.tm_panel_matmul.argtypes = lib.tm_block_matmul.argtypes
        lib.tm_vnni_matmul.argtypes = lib.tm_block_matmul.argtypes
        lib.tm_vnni16_matmul.argtypes = lib.tm_block_matmul.argtypes
        lib.tm_vnni_packed_bytes.argtypes = [_I32, _I64, _I64]
        lib.tm_vnni_packed_bytes.restype = _I64
        lib.tm_vnni_pack.argtypes = [_I32, _P, _I64, _I64, _P]
        lib.tm_vnni_unpack_rows.argtypes = [_I32, _P, _I64, _I64, _P, _I64, _P]
        lib.tm_amx_matmul_grouped.argtypes = [*lib.tm_block_matmul_grouped.argtypes, _I64]
    except (NativeBuildError, OSError, AttributeError) as e:
        log.warning("block matmul kernel unavailable, ggml's kernels multiply every GGUF matrix: %s", e)
        return None
    return lib


def available() -> bool:
    return os.environ.get(ENV_SWITCH) != "0" and library() is not None


@functools.cache
def _amx_here() -> bool:
    lib = library()
    return lib is not None and bool(lib.tm_amx_available())


def amx_available() -> bool:
    """The AMX kernel runs here: built for a CPU with AMX-BF16 and AVX512-BF16, the OS grants this process
    the tiles, and TOKENMILL_AMX_MATMUL is not 0."""
    return available() and os.environ.get(AMX_SWITCH) != "0" and _amx_here()


def amx_supports(n: int) -> bool:
    """The AMX kernel takes a matrix of n output rows (multiples of 16; K is always a multiple of 32)."""
    return n % 16 == 0


# K-quants the AMX kernel multiplies too (ggml's type numbers: Q4_K, Q5_K, Q6_K; K a multiple of 256): for big
# batches only (layers/ggml_linear.py); the integer block kernel (kquant_matmul.cpp) takes the small ones
AMX_K_TYPES = (12, 13, 14)


def supports(ggml_type: int) -> bool:
    lib = library()
    return lib is not None and bool(lib.tm_block_matmul_supports(ggml_type))


# the types the panel kernel has a panel for (Q4_0, Q4_1, Q8_0); it hands the K-quants to the block kernel
PANEL_TYPES = (2, 3, 8)
# the types the VNNI kernels' packed layout takes (pack()): those, and Q5_0 / Q5_1 / IQ4_NL (only packed: plain ones
# are ggml's)
PACK_TYPES = (2, 3, 6, 7, 8, 20)


def panel_available() -> bool:
    """The fp32 panel kernel (panel_matmul.cpp) may be used: the library built, TOKENMILL_PANEL_MATMUL is not 0."""
    return available() and os.environ.get(PANEL_SWITCH) != "0"


def vnni_asked() -> bool:
    """TOKENMILL_VNNI_MATMUL=1 (vnni_available)."""
    return os.environ.get(VNNI_SWITCH) == "1"


def vnni_built() -> bool:
    """The library has the VNNI panel kernels (vnni_matmul.cpp): built for a CPU with AVX512 F/BW/VNNI."""
    lib = library()
    return available() and lib is not None and bool(lib.tm_vnni_available())


def vnni_available() -> bool:
    """The gguf method may take the 8-bit VNNI panel kernel instead of the fp32 panel kernel at bf16 compute
    (GGUFLinearMethod.vnni_panel): built here, and asked for with TOKENMILL_VNNI_MATMUL=1. Off by default: it
    rounds x to 8 bits per 32 values as llama.cpp does, which on the default model costs agreement with the
    fp32 model (teacher-forced top-1 95.8% against the bf16 copy's 97.5%) and its answer to "What is the
    capital of France?" (llama-server's own on that file is the same wrong one); the speed it buys on Zen 4
    is in benchmarks/README.md ("8-bit VNNI panels")."""
    return vnni_asked() and vnni_built()


def vnni_bits() -> int:
    """The bits x is rounded to in the VNNI panel kernel the gguf method takes at bf16 compute in place of
    the fp32 panel kernel: 16 by default where built (vpdpwssd; x to 16 bits per 32-block, as the block
    kernel rounds it, finer than bf16's 8-bit significand: ~2e-5 relative to the fp32 product against the
    dense bf16 copy's ~2e-3), 8 with TOKENMILL_VNNI_MATMUL=1 (vnni_available), 0 (the fp32 panel) with
    TOKENMILL_VNNI_MATMUL=0, where not built, or where the AMX kernel takes bf16 batches instead."""
    if os.environ.get(VNNI_SWITCH) == "0" or not vnni_built() or amx_available():
        return 0
    return 8 if vnni_asked() else 16


def int8_panel_runs() -> bool:
    """The 8-bit VNNI panel takes bf16 batches here (asked for, built, no AMX): the rule the gguf method
    applies (vnni_bits) and the dense-copy decision counts on (platforms.Platform.with_dense_copy);
    `tokenmill plan` applies it from the CPU's flags."""
    return vnni_bits() == 8


def panel_entry(vnni_bits: int) -> str:
    """The library's panel entry point for a VNNI bit count (0: the fp32 panel kernel)."""
    return {0: "tm_panel_matmul", 8: "tm_vnni_matmul", 16: "tm_vnni16_matmul"}[vnni_bits]


# A type code's flag (block_mm, the native step's tables): the matrix is in vnni_matmul.cpp's packed layout
# (pack()); every entry point of the library takes such a code (the block kernel's entry, the grouped one and
# the panel ones multiply it on the 16-bit VNNI kernel, the 8-bit entry on the 8-bit one)
PACKED = 0x100
PACK_ROWS = 16  # the layout's row group: a matrix packed in parts starts each part but the last at a multiple


def packed_bytes(ggml_type: int, n: int, k: int) -> int:
    """Bytes of the packed layout of an (n, k) matrix of this type (PACK_TYPES; 0 where the VNNI kernels are
    not built or the type is another): per 16 rows the file's bytes (Q8_0: 576 a block of 16 rows against
    544; compute.VNNI_PACKED_PIECE)."""
    lib = library()
    return int(lib.tm_vnni_packed_bytes(ggml_type, n, k)) if lib is not None and vnni_built() else 0


def pack(ggml_type: int, src_ptr: int, n: int, k: int, dst_ptr: int) -> None:
    """n rows of plain blocks at src_ptr -> the packed layout at dst_ptr (packed_bytes(), 64-byte aligned)."""
    lib = library()
    assert lib is not None and dst_ptr % 64 == 0
    if lib.tm_vnni_pack(ggml_type, src_ptr, n, k, dst_ptr):
        raise ValueError(f"cannot pack a ({n}, {k}) matrix of ggml type {ggml_type}")


def unpack_rows(ggml_type: int, packed_ptr: int, n: int, k: int, ids_ptr: int, count: int, out_ptr: int) -> None:
    """Rows ids (count int64 at ids_ptr, each < n) of a packed (n, k) matrix back as plain blocks at out_ptr
    (count rows of the type's row bytes): the embedding's gather from a tied output layer's packed blocks."""
    lib = library()
    assert lib is not None
    if lib.tm_vnni_unpack_rows(ggml_type, packed_ptr, n, k, ids_ptr, count, out_ptr):
        raise ValueError(f"cannot read rows of a packed ({n}, {k}) matrix of ggml type {ggml_type} (an id out of range?)")


def matmul(ggml_type: int, w_ptr: int, n: int, k: int, x_ptr: int, m: int, y_ptr: int, ldy: int,
           threads: int, lib: ctypes.CDLL | None = None, amx: bool = False, panel: bool = False,
           bf16: bool = False, vnni: int = 0) -> None:
    """y[:, :n] (rows ldy apart) = x (m, k) fp32 contiguous . W^T, W (n, k) in blocks at w_ptr. amx: on the
    AMX kernel (bf16 products; only where amx_available() and amx_supports(n)); panel: on the fp32 panel
    kernel (panel_matmul.cpp), or with vnni = 8 or 16 on the VNNI one that rounds x to that many bits
    (vnni_matmul.cpp; without vnni_built() its entries give the fp32 panel's result). A type code with PACKED
    (blocks in the packed layout) goes to the 16-bit VNNI kernel unless vnni is 8. bf16 (with amx only):
    x and y are bf16 rows, y rounded as torch rounds (the bits of the fp32 call's result rounded to bf16)."""
    lib = lib or library()
    assert lib is not None and (amx or not bf16) and (panel or not vnni)
    fn = (lib.tm_amx_matmul_bf16 if bf16 else lib.tm_amx_matmul) if amx else \
        getattr(lib, panel_entry(vnni)) if panel else lib.tm_block_matmul
    rc = fn(ggml_type, w_ptr, n, k, x_ptr, k, m, y_ptr, ldy, threads)
    if rc:
        raise RuntimeError(f"block matmul failed (status {rc})")


def matmul_grouped(ggml_type: int, w_ptrs: list[int], counts: list[int], n: int, k: int, x_ptr: int, y_ptr: int,
                   threads: int, amx: bool = False) -> None:
    """Weight g (n, k) times the next counts[g] rows of x (sum(counts), k) fp32 contiguous -> the same rows
    of y (sum(counts), n) fp32, in one call; each group's rows are exactly what matmul() gives them (amx:
    with amx=True for groups of at least AMX_MIN_ROWS rows, amx=False below, as the method picks)."""
    lib = library()
    assert lib is not None
    g = len(w_ptrs)
    starts = [0] * g
    for i in range(1, g):
        starts[i] = starts[i - 1] + counts[i - 1]
    args = (ggml_type, (ctypes.c_void_p * g)(*w_ptrs), g, (ctypes.c_int64 * g)(*starts),
            (ctypes.c_int64 * g)(*counts), n, k, x_ptr, sum(counts), y_ptr, threads)
    rc = lib.tm_amx_matmul_grouped(*args, AMX_MIN_ROWS) if amx else lib.tm_block_matmul_grouped(*args)
    if rc:
        raise RuntimeError(f"grouped block matmul failed (status {rc})")
