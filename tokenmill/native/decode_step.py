"""ctypes binding to decode_step.cpp: a Llama-family decode step (every layer, then the final norm) in one
foreign call, built from the kernels the Python path calls (see the C++ header).

The structures mirror the C++ ones field for field. `kernel_table()` fills the entry points from the
loaded kernel libraries, so the step calls exactly the functions (and so computes exactly the bits) the
layer-by-layer path would. Built with g++ on first use and cached (compile.py), like the other native code;
`available()` is False when it or the kernels it calls cannot be built, or with TOKENMILL_NATIVE_DECODE=0
(read at every call, so a test or an A/B run can flip it), and the model then runs layer by layer.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

from tokenmill.native import block_matmul, ggml, kernels
from tokenmill.native.compile import NativeBuildError, build_library

log = logging.getLogger("tokenmill.native")

SOURCE = Path(__file__).with_name("decode_step.cpp")
FLAGS: tuple[str, ...] = ()  # no OpenMP of its own: the kernels it calls open their regions
ABI = 18
ENV_SWITCH = "TOKENMILL_NATIVE_DECODE"

_P, _F = ctypes.c_void_p, ctypes.c_float
_I32, _I64 = ctypes.c_int32, ctypes.c_int64
_PI32, _PI64 = ctypes.POINTER(_I32), ctypes.POINTER(_I64)


class TmKernels(ctypes.Structure):
    _fields_ = [("block_matmul", _P), ("amx_matmul", _P), ("amx_matmul_bf16", _P), ("amx_min_rows", _I64), ("panel_matmul", _P),
                ("panel_min_rows", _I64), ("ggml_matmul", _P), ("add_rms_norm", _P), ("silu_and_mul", _P),
                ("rotary", _P), ("attention", _P), ("head_rms_norm", _P), ("moe", _P),
                ("shortconv", _P), ("mamba2", _P), ("gelu_tanh_and_mul", _P), ("gdn", _P), ("sigmoid_mul", _P),
                ("sigmoid_f32", _P), ("add_layer_norm", _P)]


class TmLinear(ctypes.Structure):
    _fields_ = [("kind", _I32), ("n_parts", _I32), ("in_features", _I64), ("out_features", _I64),
                ("types", _PI32), ("ptrs", ctypes.POINTER(_P)), ("rows", _PI64), ("offsets", _PI64), ("bias", _P)]


class TmMoe(ctypes.Structure):
    _fields_ = [("router", _P), ("router_bias", _P), ("scoring", _I32), ("renorm", _I32), ("top_k", _I32),
                ("n_experts", _I32), ("n_gu", _I32), ("act", _I32), ("scaling", _F), ("alpha", _F), ("limit", _F),
                ("sel_bias", _P), ("gate_up", _P), ("down", _P), ("gu_bias", _P), ("down_bias", _P),
                ("shared_gu", _P), ("shared_down", _P), ("max_rows", _I64), ("shared_gate", TmLinear)]


class TmMamba(ctypes.Structure):
    _fields_ = [("conv_w", _P), ("conv_b", _P), ("conv_pool", _P), ("ssm_pool", _P), ("neg_a", _P), ("dt_bias", _P),
                ("skip", _P), ("norm_w", _P), ("H", _I64), ("G", _I64), ("P", _I64), ("Ns", _I64), ("K", _I64),
                ("eps", _F)]


class TmGdn(ctypes.Structure):
    _fields_ = [("conv_w", _P), ("conv_pool", _P), ("ssm_pool", _P), ("neg_a", _P), ("dt_bias", _P), ("norm_w", _P),
                ("Hk", _I64), ("Hv", _I64), ("dk", _I64), ("dv", _I64), ("K", _I64), ("tiled", _I64), ("eps", _F)]


class TmLayer(ctypes.Structure):
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("qkv", TmLinear), ("o", TmLinear), ("gate_up", TmLinear),
                ("down", TmLinear), ("k_cache", _P), ("v_cache", _P), ("window", _I64), ("rotate", _I64),
                ("q_norm", _P), ("k_norm", _P), ("moe", ctypes.POINTER(TmMoe)), ("sinks", _P),
                ("conv_w", _P), ("conv_pool", _P), ("conv_k", _I64), ("mamba", ctypes.POINTER(TmMamba)),
                ("rope_alt", _I64), ("attn_out_norm", _P), ("mlp_out_norm", _P), ("gdn", ctypes.POINTER(TmGdn)),
                ("ba", TmLinear), ("gate", _I64), ("qk_norm_whole", _I64),
                ("parallel", _I64)]


class TmModel(ctypes.Structure):
    _fields_ = [("dtype", _I32), ("num_layers", _I64), ("D", _I64), ("nh", _I64), ("nkv", _I64), ("hd", _I64),
                ("I", _I64), ("block_size", _I64), ("partition", _I64), ("rot", _I64), ("eps", _F), ("scale", _F),
                ("residual_scale", _F), ("act", _I32), ("qk_offset", _F), ("softcap", _F),
                ("qk_norm_after_rotary", _I32), ("norm", _I32),
                ("layers", ctypes.POINTER(TmLayer)), ("final_norm", _P), ("k", TmKernels)]


class TmStep(ctypes.Structure):
    _fields_ = [("M", _I64), ("num_layers", _I64), ("x", _P), ("cos", _P), ("ssin", _P), ("cos_alt", _P),
                ("ssin_alt", _P), ("tab_stride", _I64), ("slots", _P), ("tables", _P), ("table_stride", _I64),
                ("lens", _P), ("src_slots", _P), ("dst_slots", _P), ("starts", _P), ("qkv", _P), ("qk", _P),
                ("attn", _P), ("h", _P), ("y", _P), ("gate_up", _P), ("act", _P), ("out", _P), ("gate_logit", _P),
                ("shared_w", _P), ("wide_in", _P), ("wide_out", _P), ("nthreads", ctypes.c_int)]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None, logged, when it cannot be built or loaded."""
    try:
        path = build_library("tokenmill_decode_step", [SOURCE], FLAGS)
        lib = ctypes.CDLL(str(path))
        if lib.tm_decode_step_abi() != ABI:
            raise NativeBuildError(f"{path} answers ABI {lib.tm_decode_step_abi()}, expected {ABI}")
        lib.tm_decode_step.argtypes = [ctypes.POINTER(TmModel), ctypes.POINTER(TmStep)]
        lib.tm_decode_step.restype = ctypes.c_int
    except (NativeBuildError, OSError, AttributeError) as e:
        log.warning("native decode step unavailable, layers run one by one: %s", e)
        return None
    return lib


def available() -> bool:
    """Built, with the kernels it calls, and not switched off."""
    return os.environ.get(ENV_SWITCH) != "0" and library() is not None and kernels.is_enabled()


def _address(lib: ctypes.CDLL | None, name: str) -> int | None:
    return None if lib is None else ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def kernel_table(panel_min_rows: int | None = None, vnni: int = 0) -> TmKernels:
    """The entry points of the loaded kernel libraries (NULL for a library that is not built: the step
    then must not have a linear of that kind). panel_min_rows: plain blocks take the panel kernel from this
    many rows (the gguf method's calibrated figure); None: never. vnni: that panel kernel is the VNNI one
    rounding x to that many bits (8 or 16: the method's vnni_panel at the step's dtype), else (0) the fp32 one."""
    k = kernels.library()
    blocks = block_matmul.library() if block_matmul.available() else None
    amx = blocks if block_matmul.amx_available() else None
    return TmKernels(block_matmul=_address(blocks, "tm_block_matmul"), amx_matmul=_address(amx, "tm_amx_matmul"),
                     amx_matmul_bf16=_address(amx, "tm_amx_matmul_bf16"),
                     amx_min_rows=block_matmul.AMX_MIN_ROWS,
                     panel_matmul=_address(blocks if panel_min_rows is not None and block_matmul.panel_available()
                                           else None, block_matmul.panel_entry(vnni)),
                     panel_min_rows=panel_min_rows or 0,  # read only where panel_matmul is set
                     ggml_matmul=_address(ggml.lib(), "tm_matmul"),
                     add_rms_norm=_address(k, "tm_add_rms_norm"), silu_and_mul=_address(k, "tm_silu_and_mul"),
                     rotary=_address(k, "tm_rotary_part"), attention=_address(k, "tm_paged_attention_rows"),
                     head_rms_norm=_address(k, "tm_head_rms_norm"), moe=_address(ggml.lib(), "tm_moe"),
                     shortconv=_address(k, "tm_shortconv_decode"), mamba2=_address(k, "tm_mamba2_decode"),
                     gelu_tanh_and_mul=_address(k, "tm_gelu_tanh_and_mul"), gdn=_address(k, "tm_gdn_decode"),
                     sigmoid_mul=_address(k, "tm_sigmoid_mul"), sigmoid_f32=_address(k, "tm_sigmoid_f32"),
                     add_layer_norm=_address(k, "tm_add_layer_norm"))


def run(model: ctypes.Structure, step: ctypes.Structure) -> None:
    lib = library()
    assert lib is not None
    rc = lib.tm_decode_step(ctypes.byref(model), ctypes.byref(step))
    if rc:
        raise RuntimeError(f"native decode step failed (status {rc})")
