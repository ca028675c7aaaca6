"""A Llama-family (or Gemma) decode step in one native call (native/decode_step.cpp), where the model and the step
fit.

The layer-by-layer forward spends ~190 us of Python per layer on a CPU decode step (module calls, tensor
allocation, ctypes argument conversion): on SmolLM2 (30 layers) a third of a one-stream step. This runs the
same kernels with the same arguments from C++, so its hidden states are the Python path's bit for bit
(tests/model/test_native_decode.py holds them equal).

What fits, checked once per model (`unsupported` says why not, logged once):
- fp32 or bf16 compute (the kernels' dtypes; at bf16 each matmul widens its input and rounds its output,
  as torch does around the same kernels); matmuls on the gguf method's block kernels (plain Q4_0 / Q4_1 /
  Q8_0: ours; other types, repacked or not: ggml's), with or without a bias (Qwen2, gpt-oss); RMSNorm, SiLU-gated
  MLP, rotary through the native kernel, full or partial (Phi-4-mini's; or none on a layer: SmolLM3's NoPE layers), Granite's
  multipliers, per-head q/k norms before rotary on the native kernel (Qwen3's; after it: Hunyuan's), attention sinks
  (gpt-oss's);
- Cohere2's layers: LayerNorms (no bias) on their native kernel, attention and the MLP side by side on one norm;
  Arcee's ungated MLP, down(relu(up) ** 2);
- Gemma's layers: the GELU-gated MLP on its native kernel, (1 + w) norms, and Gemma 2 / 3's norms after each
  sublayer (GLM-4's too; OLMo 2's and EXAONE 4's only after), (1 + w) q/k norms (Gemma 3), the local layers' own
  rotary tables (any windowed layers' own tables: the step's second ones), the attention soft-cap (Gemma 2); the
  embeddings scaled by the model's own embed();
- mixture-of-experts layers where their one-call path applies with the router inside (SparseMoE.one_call_layer:
  Qwen3-MoE, Mixtral, Granite MoE, ERNIE 4.5 MoE, OLMoE, gpt-oss, Qwen2-MoE and Qwen3.5 MoE with experts on ggml's
  kernels; a shared expert inside, gated (sigmoid(h . w) on its own small matmul) or not), beside dense ones;
- LFM2's layers (a short conv or attention, then the MLP or experts): the conv between its projections on
  tm_shortconv_decode, each sequence's window read from and written to the step's state slots; Granite 4.0-H's
  (a Mamba2 layer or attention): the conv, scan and gated norm on tm_mamba2_decode over the slots' windows and
  states; Qwen3.5's (dense MLPs): a Gated DeltaNet layer's conv, delta rule and gated norm on tm_gdn_decode
  between in_proj_qkvz / in_proj_ba and out_proj, and its gated attention (q's heads copied out from between
  their gates, the output times sigmoid(gate) on tm_sigmoid_mul);
and per step: every token a decode on the native paged backend (speculative verification's entries
included; with short convs, every sequence one the conv kernel takes: leading_decodes), at most the method's
crossover rows (past it the Python path multiplies dense tiles), within the rows the experts' one call takes
(no expert past the crossover, at most moe._ONE_CALL_SLOTS slots), any sliding windows. Everything else runs
layer by layer, as before.

One thread count for the whole step, chosen as the matmuls' is (layers/thread_choice.py), by timing the
step. Results do not depend on it.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from tokenmill.attention.backend import AttentionContext
from tokenmill.attention.native_paged import NativePagedAttentionBackend
from tokenmill.layers.activation import GeluTanhAndMul, SiluAndMul
from tokenmill.layers.gated_delta import leading_decodes, slot_tensors
from tokenmill.layers.ggml_linear import GGUFLinearMethod
from tokenmill.layers.linear import Linear
from tokenmill.layers import moe as moe_mod
from tokenmill.layers.mlp import GatedMLP, ReLUSquared, UpDownMLP
from tokenmill.layers.moe import SparseMoE
from tokenmill.layers.norm import LayerNorm
from tokenmill.layers.thread_choice import ThreadChooser
from tokenmill.native import decode_step, kernels
from tokenmill.native.decode_step import TmGdn, TmLayer, TmLinear, TmMamba, TmModel, TmMoe, TmStep

if TYPE_CHECKING:
    from tokenmill.models.gemma3 import Gemma3ForCausalLM
    from tokenmill.models.llama import LlamaForCausalLM

    Model: TypeAlias = LlamaForCausalLM | Gemma3ForCausalLM

log = logging.getLogger("tokenmill")

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the C++ step's dtype codes
_ACTS = {SiluAndMul: 0, GeluTanhAndMul: 1, ReLUSquared: 2}  # the MLP's activation -> the step's code


def decide(model: Model) -> NativeDecode | None:
    """The model's native decode step, or None (logged with the reason) where its steps run layer by layer."""
    reason = unsupported(model)
    log.info("decode steps: %s", "one native call (native/decode_step.cpp)" if reason is None else
             f"layer by layer ({reason})")
    return NativeDecode(model) if reason is None else None


def unsupported(model: Model) -> str | None:
    """Why this model's decode steps cannot run natively, or None when they can."""
    if not decode_step.available():
        return "the native decode step is not built or is off (TOKENMILL_NATIVE_DECODE=0)"
    cfg = model.cfg
    from tokenmill.models.cohere2 import Cohere2DecoderLayer
    from tokenmill.models.gemma import GemmaDecoderLayer  # (all import this module)
    from tokenmill.models.gemma3 import Gemma3Attention, Gemma3DecoderLayer
    from tokenmill.models.glm4 import Glm4DecoderLayer
    from tokenmill.models.moe import OlmoeDecoderLayer
    from tokenmill.models.olmo2 import Exaone4DecoderLayer, Olmo2Attention, Olmo2DecoderLayer
    from tokenmill.models.gpt_oss import GptOssAttention, GptOssDecoderLayer
    from tokenmill.models.granite_hybrid import GraniteHybridDecoderLayer, Mamba2Mixer
    from tokenmill.models.lfm2 import Lfm2DecoderLayer, ShortConv
    from tokenmill.models.llama import LlamaAttention, LlamaDecoderLayer
    from tokenmill.models.qwen3_5 import GatedDeltaNet, Qwen3_5Attention, Qwen3_5DecoderLayer

    # the step computes llama's layer, Cohere2's (a LayerNorm feeding attention and the MLP side by side), Gemma 2 /
    # 3's and GLM-4's (norms after each sublayer too) and OLMo 2's and EXAONE 4's (only after); gpt-oss's classes only
    # build other modules (a biased o_proj, the sinks) around llama's forward, Gemma's only other norms and MLP;
    # LFM2's layer is llama's with a short conv or llama's attention as its mixer, Granite 4.0-H's a Mamba2 one or
    # llama's attention, Qwen3.5's a Gated DeltaNet or llama's attention with an output gate
    def fits(layer: Any) -> bool:
        if type(layer) is Lfm2DecoderLayer:
            return type(layer.conv) is ShortConv if layer.is_conv else type(layer.self_attn) is LlamaAttention
        if type(layer) is GraniteHybridDecoderLayer:
            return type(layer.mamba) is Mamba2Mixer if layer.is_mamba else type(layer.self_attn) is LlamaAttention
        if type(layer) is Gemma3DecoderLayer:
            return type(layer.self_attn) is Gemma3Attention
        if type(layer) in (Olmo2DecoderLayer, Exaone4DecoderLayer, OlmoeDecoderLayer):
            return type(layer.self_attn) is layer.attention and layer.attention in (Olmo2Attention, LlamaAttention)
        if type(layer) is Qwen3_5DecoderLayer:
            return type(layer.linear_attn) is GatedDeltaNet if layer.is_linear \
                else type(layer.self_attn) is Qwen3_5Attention
        return type(layer) in (LlamaDecoderLayer, GptOssDecoderLayer, GemmaDecoderLayer, Glm4DecoderLayer,
                               Cohere2DecoderLayer) \
            and type(layer.self_attn) in (LlamaAttention, GptOssAttention)

    other = {type(layer).__name__ for layer in _layers(model) if not fits(layer)}
    if other:
        return f"a decoder layer other than llama's ({', '.join(sorted(other))})"
    dtype = model.model.norm.weight.dtype
    if dtype not in _DTYPES:
        return f"{dtype} compute (the native kernels take fp32 and bf16)"
    for rope in model.native_rotary():
        if rope is not None and (not rope.use_native or rope.cos.dtype != dtype):
            return "rotary tables not on the native kernels"
    norms: list[Any] = [model.model.norm]
    table = decode_step.kernel_table()
    has_ggml = table.ggml_matmul is not None
    widths, acts, attention = set(), set(), set()
    for layer in _layers(model):
        mlp, a, conv, mamba, gdn = layer.mlp, _attention(layer), _conv(layer), _mamba(layer), _gdn(layer)
        if a is not None:  # what the step takes once for the model
            attention.add((a.scale, a.softcap, None if a.q_norm is None else a.q_norm.weight_offset))
        if conv is not None:
            if conv.native is None or table.shortconv is None:
                return "a short conv not on the native kernel"
        elif mamba is not None:
            if mamba.native is None or mamba.scan_params is None or table.mamba2 is None:
                return "a Mamba2 layer not on the native kernel"
        elif gdn is not None:
            if gdn.native is None or gdn.neg_a is None or gdn.dt_f32 is None or table.gdn is None \
                    or 2 * gdn.hv > cfg.hidden_size:
                return "a Gated DeltaNet layer not on the native kernel"
        elif a.sinks is not None and a.sinks.shape != (cfg.num_heads,):
            return "attention sinks of another shape"
        elif a.q_norm is not None and a.k_norm is not None or _whole_qk_norms(a):
            for hn in _qk_norms(a):
                if not hn.use_native or hn.weight.dtype != dtype or hn.eps != cfg.rms_norm_eps:
                    return "q/k norms not on the native kernel"
        linears = _mixer_linears(layer) + _extra_linears(layer)
        if isinstance(mlp, SparseMoE):
            why = _moe_unsupported(mlp, table.moe is not None)
            if why:
                return why
            if mlp.shared_expert_gate is not None:  # its (1, D) matmul: the step's
                linears.append(mlp.shared_expert_gate)
        elif not (isinstance(mlp, GatedMLP) and type(mlp.act) in _ACTS and mlp.act.use_native
                  or type(mlp) is UpDownMLP and type(mlp.act) is ReLUSquared):
            return "an MLP other than the native SiLU- or GELU-gated one, relu(up) ** 2 or experts"
        else:
            widths.add(_mlp_width(mlp))
            acts.add(type(mlp.act))
            linears += [_mlp_in(mlp), mlp.down_proj]
        norms += [n for n in _sublayer_norms(layer) if n is not None]
        for lin in linears:
            if not isinstance(lin.method, GGUFLinearMethod) or (lin.matmul is None and lin.block_mm is None):
                return "matmuls not on the gguf method's block kernels"
            if lin.block_mm is None and not has_ggml:
                return "ggml not loaded"
            if lin.bias is not None and (lin.bias.dtype != dtype or not lin.bias.is_contiguous()):
                return "a bias in another dtype"
    if len(widths) > 1 or len(acts) > 1:
        return "dense MLPs of different widths or activations"
    if len(attention) > 1:
        return "attention layers with different scales, soft-caps or q / k norms"
    for n in norms:
        if not n.use_native or n.weight.dtype != dtype or n.eps != cfg.rms_norm_eps:
            return "norms not on the native kernel"
    if len({isinstance(n, LayerNorm) for n in norms}) > 1:
        return "RMSNorms beside LayerNorms"
    return None


def _mlp_in(mlp: Any) -> Linear:
    """A dense MLP's first projection: gate|up (the step's gate_up), or an ungated one's up (Arcee's)."""
    return mlp.up_proj if type(mlp) is UpDownMLP else mlp.gate_up_proj


def _mlp_width(mlp: Any) -> int:
    """A dense MLP's intermediate width I (gate|up gives 2 I rows, an ungated up I)."""
    rows = _mlp_in(mlp).out_features
    return rows if type(mlp) is UpDownMLP else rows // 2


def _sublayer_norms(layer: Any) -> tuple[Any, Any, Any, Any]:
    """(the norm before the mixer, of its output, before the MLP, of its output), None where the layer has none: Gemma
    2 / 3's and GLM-4's norm each sublayer's output too, under their own names; OLMo 2's and EXAONE 4's only that."""
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2 / 3
        return (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                layer.post_feedforward_layernorm)
    if hasattr(layer, "post_mlp_layernorm"):  # GLM-4
        return (layer.input_layernorm, layer.post_self_attn_layernorm, layer.post_attention_layernorm,
                layer.post_mlp_layernorm)
    if hasattr(layer, "post_feedforward_layernorm"):  # OLMo 2, EXAONE 4
        return None, layer.post_attention_layernorm, None, layer.post_feedforward_layernorm
    if getattr(layer, "parallel_mlp", False):  # Cohere2: one norm for both sublayers
        return layer.input_layernorm, None, None, None
    return layer.input_layernorm, None, layer.post_attention_layernorm, None


def _whole_qk_norms(a: Any) -> bool:
    """The attention's q / k norms normalize the whole projection (OLMo 2's q_norm_full / k_norm_full)."""
    return getattr(a, "q_norm_full", None) is not None


def _qk_norms(a: Any) -> tuple[Any, Any]:
    """The attention's (q norm, k norm): per head, or over the whole projection."""
    return (a.q_norm_full, a.k_norm_full) if _whole_qk_norms(a) else (a.q_norm, a.k_norm)


def _conv(layer: Any) -> Any:
    """The layer's short conv mixer (LFM2's ShortConv), or None (attention)."""
    return layer.conv if getattr(layer, "is_conv", False) else None


def _mamba(layer: Any) -> Any:
    """The layer's Mamba2 mixer (Granite 4.0-H's Mamba2Mixer), or None."""
    return layer.mamba if getattr(layer, "is_mamba", False) else None


def _gdn(layer: Any) -> Any:
    """The layer's Gated DeltaNet mixer (Qwen3.5's), or None."""
    return layer.linear_attn if getattr(layer, "is_linear", False) else None


def _attention(layer: Any) -> Any:
    """The layer's attention mixer, or None (a recurrent one)."""
    recurrent = _conv(layer) is not None or _mamba(layer) is not None or _gdn(layer) is not None
    return None if recurrent else layer.self_attn


def _mixer_linears(layer: Any) -> list[Linear]:
    """The token mixer's projections: q|k|v and o, or a recurrent mixer's in_proj and out_proj (the step's qkv and
    o; a Gated DeltaNet's in_proj_qkvz and out_proj)."""
    gdn = _gdn(layer)
    if gdn is not None:
        return [gdn.in_proj_qkvz, gdn.out_proj]
    rec = _conv(layer) or _mamba(layer)
    if rec is not None:
        return [rec.in_proj, rec.out_proj]
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj]


def _extra_linears(layer: Any) -> list[Linear]:
    """The mixer's other projections: a Gated DeltaNet's in_proj_ba (the step's ba), or none."""
    gdn = _gdn(layer)
    return [gdn.in_proj_ba] if gdn is not None else []


def _kept(t: torch.Tensor, keep: list[object]) -> int:
    """t's address, t kept alive in `keep`."""
    keep.append(t)
    return t.data_ptr()


def _moe_unsupported(mlp: SparseMoE, has_moe: bool) -> str | None:
    """Why this mixture-of-experts layer cannot run in the native step (it takes the layer's one-call path with
    the router inside and a shared expert, if any, ungated and inside), or None."""
    if any(getattr(type(mlp), f) is not getattr(SparseMoE, f) for f in ("forward", "_one_call", "route")) \
            or type(mlp.experts[0].act) not in moe_mod._NATIVE_ACTS:  # type: ignore[attr-defined]
        return "experts the one native call does not take"
    found = mlp.one_call_layer()
    if found is None or not has_moe:
        return "experts not on ggml's kernels in one call"
    layer = found[0]
    if not layer.has_router:
        return "a router not on ggml's kernels"
    if mlp.shared_expert is not None and not layer.has_shared:
        return "a shared expert the experts' call does not take"
    return None


def _moe_rows(mlp: SparseMoE, method: GGUFLinearMethod) -> int:
    """The most rows a step may have for this layer's one call to take it whole: as SparseMoE._one_call decides."""
    found = mlp.one_call_layer()
    assert found is not None
    layer, dense_ok, shared_dense = found
    rows = moe_mod._ONE_CALL_SLOTS // mlp.top_k
    if dense_ok or (layer.has_shared and shared_dense):  # an expert (every token, for the shared one) may not pass it
        rows = min(rows, method.max_ggml_rows)
    return rows


def _layers(model: Model) -> list[Any]:
    """The decoder layers (LlamaDecoderLayer; typed loosely, as nn.Module attributes are)."""
    return list(model.model.layers)


def _linear(lin: Linear, keep: list[object], dtype: torch.dtype) -> TmLinear:
    """The C struct for one gguf-method linear at compute dtype `dtype`; the arrays it points to go into
    `keep`. Its kernel is the one the layer path picks (GGUFLinearMethod.apply)."""
    bias = lin.bias.data_ptr() if lin.bias is not None else None
    if lin.block_mm is not None:  # [(ggml type, blocks' address, rows, first output column)]
        parts = lin.block_mm
        n = len(parts)
        arrays: tuple[ctypes.Array, ...] = (  # type: ignore[type-arg]
            (ctypes.c_int32 * n)(*(p[0] for p in parts)), (ctypes.c_void_p * n)(*(p[1] for p in parts)),
            (ctypes.c_int64 * n)(*(p[2] for p in parts)), (ctypes.c_int64 * n)(*(p[3] for p in parts)))
        kind = 2 if GGUFLinearMethod.uses_amx(lin, dtype) else 0
    else:
        mm = lin.matmul
        assert mm is not None
        n = len(mm.weights)
        arrays = ((ctypes.c_int32 * n)(), (ctypes.c_void_p * n)(*(w.handle for w in mm.weights)),
                  (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)(*mm.offsets))
        kind = 1
    keep.append(arrays)
    t, p, r, o = arrays
    return TmLinear(kind=kind, n_parts=n, in_features=lin.in_features, out_features=lin.out_features,
                    types=ctypes.cast(t, ctypes.POINTER(ctypes.c_int32)),
                    ptrs=ctypes.cast(p, ctypes.POINTER(ctypes.c_void_p)),
                    rows=ctypes.cast(r, ctypes.POINTER(ctypes.c_int64)),
                    offsets=ctypes.cast(o, ctypes.POINTER(ctypes.c_int64)), bias=bias)


class NativeDecode:
    """forward() -> the final hidden states of a decode step computed natively, or None (not for it)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        # ((id of the caches, the state pools' addresses, the method's panel_min_rows and crossover), struct, what it
        # points to)
        self._plan: tuple[tuple[int, int, int, int | None, int], TmModel, list[object]] | None = None
        self._threads = ThreadChooser(torch.get_num_threads())  # a new one when torch's team changes
        layers = _layers(model)
        method = _mixer_linears(layers[0])[0].method
        assert isinstance(method, GGUFLinearMethod)  # (unsupported() checked)
        self._method = method
        cfg = model.cfg
        self._recurrent = any(_attention(layer) is None for layer in layers)  # short convs or Mamba2 layers
        first = next((a for a in map(_attention, layers) if a is not None), None)  # (read only with attention)
        self._scale: float = first.scale if first is not None else 1.0
        self._softcap: float = first.softcap if first is not None else 0.0
        self._qk_offset = first.q_norm.weight_offset if first is not None and first.q_norm is not None else 0.0
        self._rope, self._rope_alt = model.native_rotary()
        windows = cfg.layer_windows()
        self._alt_layers = [self._rope_alt is not None and windows[i] > 0 for i in range(len(layers))]
        self._moes: list[SparseMoE] = [layer.mlp for layer in layers if isinstance(layer.mlp, SparseMoE)]
        self._gated_shared = any(mlp.shared_expert_gate is not None for mlp in self._moes)
        self._moe_limit: tuple[int, int] | None = None  # (the method's crossover, the rows every MoE layer takes)
        dense = [layer.mlp for layer in layers if not isinstance(layer.mlp, SparseMoE)]
        linears = [lin for layer in layers for lin in _mixer_linears(layer) + _extra_linears(layer)]
        linears += [lin for mlp in dense for lin in (_mlp_in(mlp), mlp.down_proj)]
        self._macs_per_row = sum(lin.in_features * lin.out_features for lin in linears)
        for mlp in self._moes:  # its router and the experts (and shared expert) a token runs through
            found = mlp.one_call_layer()
            assert found is not None
            self._macs_per_row += found[0].macs_per_token + mlp.num_experts * cfg.hidden_size
        inter = _mlp_width(dense[0]) if dense else 0
        self._act = _ACTS[type(dense[0].act)] if dense else 0
        # a recurrent mixer's in_proj rows go where q|k|v's do, what it gives out_proj where attention's output does
        recurrent = [_mixer_linears(layer) for layer in layers if _attention(layer) is None]
        gated = any(a is not None and a.output_gate for a in map(_attention, layers))  # q's rows twice as wide
        self._widths = (cfg.hidden_size,
                        max([((2 if gated else 1) * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim]
                            + [i.out_features for i, _ in recurrent]),
                        max([cfg.num_heads * cfg.head_dim] + [o.in_features for _, o in recurrent]), inter)
        self._qk_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim if gated else 0
        self.dtype = model.model.norm.weight.dtype
        self._max_in = max(lin.in_features for lin in linears)  # bf16: the fp32 rows a matmul reads / writes
        self._max_out = max([lin.out_features for lin in linears] + [cfg.hidden_size])  # (experts: D in and out)

    def _moe_rows(self) -> int:
        """The most rows a step may have for every MoE layer's one call to take it whole (the method's crossover
        may move once, at calibration)."""
        key = self._method.max_ggml_rows
        if self._moe_limit is None or self._moe_limit[0] != key:
            self._moe_limit = (key, min(_moe_rows(mlp, self._method) for mlp in self._moes))
        return self._moe_limit[1]

    def _mamba_struct(self, mamba: Any, rec: Any, keep: list[object]) -> Any:
        """A pointer to the TmMamba of one Mamba2 layer over the step's pools (kept in `keep`)."""
        assert mamba.native is not None and mamba.scan_params is not None
        (conv_w, conv_b, norm_w), (neg_a, dt_bias, skip) = mamba.native, mamba.scan_params
        j = mamba.state_index
        struct = TmMamba(conv_w=conv_w.data_ptr(), conv_b=conv_b.data_ptr(), conv_pool=rec.conv[j].data_ptr(),
                         ssm_pool=rec.ssm[j].data_ptr(), neg_a=neg_a.data_ptr(), dt_bias=dt_bias.data_ptr(),
                         skip=skip.data_ptr(), norm_w=norm_w.data_ptr(), H=mamba.heads, G=mamba.groups,
                         P=mamba.head_dim, Ns=mamba.d_state, K=conv_w.shape[1], eps=mamba.eps)
        keep.append(struct)
        return ctypes.pointer(struct)

    def _gdn_struct(self, gdn: Any, rec: Any, keep: list[object]) -> Any:
        """A pointer to the TmGdn of one Gated DeltaNet layer over the step's pools (kept in `keep`)."""
        assert gdn.native is not None and gdn.neg_a is not None and gdn.dt_f32 is not None
        conv_w, norm_w = gdn.native
        j = gdn.state_index
        struct = TmGdn(conv_w=conv_w.data_ptr(), conv_pool=rec.conv[j].data_ptr(), ssm_pool=rec.ssm[j].data_ptr(),
                       neg_a=gdn.neg_a.data_ptr(), dt_bias=gdn.dt_f32.data_ptr(), norm_w=norm_w.data_ptr(), Hk=gdn.hk,
                       Hv=gdn.hv, dk=gdn.dk, dv=gdn.dv, K=conv_w.shape[1], tiled=int(gdn.v_heads_tiled), eps=gdn.eps)
        keep.append(struct)
        return ctypes.pointer(struct)

    def _moe_struct(self, mlp: SparseMoE, keep: list[object]) -> Any:
        """A pointer to the TmMoe of one mixture-of-experts layer (kept in `keep`)."""
        found = mlp.one_call_layer()
        assert found is not None
        layer, dense_ok, _ = found
        struct = TmMoe(**layer.step_fields(), max_rows=self._method.moe_max_rows(dense_ok))  # as apply_moe passes
        if mlp.shared_expert_gate is not None:
            struct.shared_gate = _linear(mlp.shared_expert_gate, keep, self.dtype)
        keep.append(struct)
        return ctypes.pointer(struct)

    def _model_struct(self, attn: AttentionContext) -> TmModel:
        caches = attn.kv_caches
        rec = attn.recurrent if self._recurrent else None
        key = (id(caches), 0 if rec is None else rec.conv.data_ptr(), 0 if rec is None else rec.ssm.data_ptr(),
               self._method.panel_min_rows, self._method.max_ggml_rows)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        m, cfg = self.model, self.model.cfg
        keep: list[object] = []
        layers = (TmLayer * len(m.model.layers))()
        for i, layer in enumerate(_layers(m)):
            mlp, a, conv, mamba, gdn = layer.mlp, _attention(layer), _conv(layer), _mamba(layer), _gdn(layer)
            experts = isinstance(mlp, SparseMoE)
            mix_in, mix_out = _mixer_linears(layer)
            pre_mix, attn_out, pre_mlp, mlp_out = (None if n is None else n.weight.data_ptr()
                                                   for n in _sublayer_norms(layer))
            lyr = TmLayer(input_norm=pre_mix, post_norm=pre_mlp, attn_out_norm=attn_out, mlp_out_norm=mlp_out,
                          rope_alt=int(self._alt_layers[i]), parallel=int(getattr(layer, "parallel_mlp", False)),
                          qkv=_linear(mix_in, keep, self.dtype), o=_linear(mix_out, keep, self.dtype),
                          gate_up=TmLinear() if experts else _linear(_mlp_in(mlp), keep, self.dtype),
                          down=TmLinear() if experts else _linear(mlp.down_proj, keep, self.dtype),
                          moe=self._moe_struct(mlp, keep) if experts else None)
            if conv is not None:  # the step's conv pool: conv[j] (slots, D, K - 1) for the layer's state index j
                assert rec is not None and conv.native is not None
                lyr.conv_w, lyr.conv_k = conv.native.data_ptr(), conv.native.shape[1]
                lyr.conv_pool = rec.conv[conv.state_index].data_ptr()
            elif mamba is not None:  # ... and its state: ssm[j] (slots, H, P, Ns)
                assert rec is not None
                lyr.mamba = self._mamba_struct(mamba, rec, keep)
            elif gdn is not None:  # ... or the delta rule's: ssm[j] (slots, Hv, dk, dv)
                assert rec is not None
                lyr.gdn, lyr.ba = self._gdn_struct(gdn, rec, keep), _linear(gdn.in_proj_ba, keep, self.dtype)
            else:
                k_cache, v_cache = caches[a.layer_idx]
                lyr.k_cache, lyr.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
                lyr.window, lyr.rotate, lyr.gate = a.sliding_window, int(a.rotates), int(a.output_gate)
                qn, kn = _qk_norms(a)
                lyr.q_norm = None if qn is None else qn.weight.data_ptr()
                lyr.k_norm = None if kn is None else kn.weight.data_ptr()
                lyr.qk_norm_whole = int(_whole_qk_norms(a))
                lyr.sinks = None if a.sinks is None else _kept(a.sinks.detach().float().contiguous(), keep)
            layers[i] = lyr
        keep.append(layers)
        bs = caches[0][0].shape[1]
        struct = TmModel(dtype=_DTYPES[self.dtype], num_layers=len(layers), D=cfg.hidden_size, nh=cfg.num_heads,
                         nkv=cfg.num_kv_heads,
                         hd=cfg.head_dim, I=self._widths[3], block_size=bs,
                         partition=kernels.DEFAULT_PARTITION, rot=cfg.rotary_dim or cfg.head_dim, eps=cfg.rms_norm_eps,
                         scale=self._scale, residual_scale=cfg.residual_multiplier, act=self._act,
                         qk_offset=self._qk_offset, softcap=self._softcap,
                         qk_norm_after_rotary=int(cfg.qk_norm_after_rotary),
                         norm=int(isinstance(m.model.norm, LayerNorm)), layers=layers,
                         final_norm=m.model.norm.weight.data_ptr(),
                         k=decode_step.kernel_table(self._method.panel_min_rows,
                                                     self._method.vnni_panel(self.dtype)))
        self._plan = (key, struct, [caches, rec, keep])
        return struct

    def fits(self, T: int, attn: AttentionContext) -> bool:
        """This step: T tokens, all decodes on the native attention kernel, over caches of the model's dtype,
        within the block kernels' rows."""
        meta, backend = attn.metadata, attn.backend
        if (T == 0 or meta.num_decodes != T or meta.decode_context_lens is None or meta.decode_block_tables is None
                or not isinstance(backend, NativePagedAttentionBackend) or not backend.use_kernel):
            return False
        if T > self._method.max_step_rows or not decode_step.available():
            return False
        if self._moes and T > self._moe_rows():
            return False
        if self._recurrent:  # every sequence a decode the recurrent kernels take (leading, not chained)
            rec = attn.recurrent
            if rec is None or len(leading_decodes(rec.seqs)) != T or any(
                    p.dtype != torch.float32 or not p.is_contiguous() for p in (rec.conv, rec.ssm)):
                return False
        return all(k.dtype == self.dtype and k.is_contiguous() for k, _ in attn.kv_caches[:1])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None) -> torch.Tensor | None:
        """input_ids, positions (T,) -> final hidden states (T, D), or None: not for this step."""
        T = input_ids.shape[0]
        if not self.fits(T, attn):
            return None
        cfg = self.model.cfg
        if cfg.attn_temperature_scale and int(positions.max()) >= cfg.attn_temperature_length:
            return None  # q's temperature is not 1 past the original context: the layer path applies it
        m = self.model
        assert self._rope is not None
        model = self._model_struct(attn)
        meta = attn.metadata
        x = m.embed(input_ids).to(self.dtype).contiguous()  # (scaled as the layer path scales them)
        rope = self._rope.tables(positions)
        cos, ssin = rope.cos.reshape(T, -1), rope.signed_sin.reshape(T, -1)
        cos_alt = ssin_alt = cos  # (unread without windowed layers on their own tables)
        if self._rope_alt is not None and any(self._alt_layers[:num_layers]):
            alt = self._rope_alt.tables(positions)
            cos_alt, ssin_alt = alt.cos.reshape(T, -1), alt.signed_sin.reshape(T, -1)
            assert cos_alt.stride(0) == cos.stride(0) and ssin_alt.stride(0) == ssin.stride(0) == cos.stride(0)
        D, qkv_w, attn_w, inter = self._widths
        widths = [D, D, D, qkv_w, attn_w, 2 * inter, inter, self._qk_width]  # out, h, y, qkv, attn, gate_up, act, qk
        bufs = torch.empty(T * sum(widths), dtype=self.dtype).split([T * w for w in widths])
        wide = torch.empty(T * (self._max_in + self._max_out) if self.dtype != torch.float32 else 0)
        out = bufs[0].view(T, D)
        starts = torch.empty(T, dtype=torch.int64)
        gated = self._gated_shared  # (gated shared experts' scratch; unread without them)
        gate_logit, shared_w = (torch.empty(T, dtype=self.dtype), torch.empty(T)) if gated else (starts, starts)
        tables, lens = meta.decode_block_tables, meta.decode_context_lens
        assert tables is not None and lens is not None
        tables = tables if tables.stride(1) == 1 else tables.contiguous()
        lens, slots = lens.contiguous(), meta.slot_mapping.contiguous()
        n = len(m.model.layers) if num_layers is None else num_layers
        src = dst = starts  # (unread without short conv layers)
        if self._recurrent:
            assert attn.recurrent is not None
            src, dst = slot_tensors(leading_decodes(attn.recurrent.seqs))
        step = TmStep(M=T, num_layers=n, x=x.data_ptr(), cos=cos.data_ptr(), ssin=ssin.data_ptr(),
                      cos_alt=cos_alt.data_ptr(), ssin_alt=ssin_alt.data_ptr(),
                      tab_stride=cos.stride(0), slots=slots.data_ptr(), tables=tables.data_ptr(),
                      table_stride=tables.stride(0), lens=lens.data_ptr(), src_slots=src.data_ptr(),
                      dst_slots=dst.data_ptr(), starts=starts.data_ptr(),
                      h=bufs[1].data_ptr(), y=bufs[2].data_ptr(), qkv=bufs[3].data_ptr(), attn=bufs[4].data_ptr(),
                      qk=bufs[7].data_ptr(),
                      gate_up=bufs[5].data_ptr(), act=bufs[6].data_ptr(), out=out.data_ptr(),
                      gate_logit=gate_logit.data_ptr(), shared_w=shared_w.data_ptr(), wide_in=wide.data_ptr(),
                      wide_out=wide.data_ptr() + 4 * T * self._max_in, nthreads=1)

        def call(threads: int) -> None:
            step.nthreads = threads
            decode_step.run(model, step)

        if self._threads.team != torch.get_num_threads():
            self._threads = ThreadChooser(torch.get_num_threads())
        self._threads.run(T * self._macs_per_row * n // len(m.model.layers), call)
        return out
