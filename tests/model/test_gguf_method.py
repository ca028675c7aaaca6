"""The gguf linear method: GGUF blocks kept as they are, multiplied by ggml's kernels.

References are independent of ggml: gguf-py's own dequantizer (numpy) and F.linear / the `dequantize`
engine. ggml quantizes activations to 8 bits per 32 (or 256) values before its integer dot products, as
llama.cpp does; our block kernel for plain Q4_0 / Q4_1 / Q8_0 blocks (native/block_matmul.cpp) to 16 bits.
So the kernels are held to error bounds, not equality:
- one matmul: relative error <= 2e-2 against fp32 on the dequantized weight (measured 4e-3 to 1e-2 for
  ggml's kernels);
- the default model (SmolLM2 Q4_1, Q8_0 embedding and head: all on the block kernel), teacher-forced over
  1,000 tokens of text and code: median relative logit error <= 1e-3 (measured 6e-5 to 1e-4), top-1
  agreement >= 98% (measured 99.9% on 2,000 tokens; with 8-bit activations, as llama.cpp computes, 95.9%);
- tiny random models in Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q6_K: max relative logit error <= 5e-2 (measured
  1.3e-2 to 2e-2), top-1 >= 85% (random models' logits are flat, so near-ties are common).
Exact where the arithmetic is the same: the dense path (dequantize + F.linear) equals the `dequantize`
engine bit for bit, and within ggml's path on plain blocks each output row depends only on its own input
row, so batched == alone holds exactly while every step stays on one path, except as follows (found here,
and stated in the README). ggml's repacked kernels (Q4_0, Q4_K, IQ4_NL on AVX2) compute 4-row tiles and
single rows differently: not row-independent. Since ggml 0.25, plain K-quant blocks (Q2_K-Q6_K) are
multiplied in tiles once a batch has rows enough (ggml-cpu/tiled/) and one row at a time otherwise, which
sum in another order: not row-independent either (measured 1e-7 to 3e-7 of the row's largest output; bound 1e-5).
"""


from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from raw_forward import prompt_logits

from tokenmill import LLM, SamplingParams
from tokenmill.layers.ggml_linear import GGUFLinearMethod
from tokenmill.native import block_matmul, ggml

pytestmark = pytest.mark.skipif(not ggml.available(), reason=f"ggml not built here: {ggml.unavailable_reason()}")

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL"]

# plain-block types that ggml multiplies in tiles for a big enough batch and row by row for a small one
TILED_PLAIN = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def ggml_engine(model: str | None = None, max_rows: int = 10**6, **kw) -> LLM:
    """An engine on the gguf method with ggml's kernels for every row count up to max_rows (fixed, not
    calibrated, so a test knows which path each step takes)."""
    old = os.environ.get("TOKENMILL_GGML_MAX_ROWS")
    os.environ["TOKENMILL_GGML_MAX_ROWS"] = str(max_rows)
    try:
        args = dict(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32") | kw
        return LLM(model, **args) if model else LLM(**args)
    finally:
        if old is None:
            del os.environ["TOKENMILL_GGML_MAX_ROWS"]
        else:
            os.environ["TOKENMILL_GGML_MAX_ROWS"] = old


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("repack", [False, True])
def test_one_matmul_per_type_against_fp32(type_name: str, repack: bool) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from tokenmill.layers.ggml_linear import GGUFLinearMethod
    from tokenmill.layers.linear import Linear
    from tokenmill.loader.weights import GGUFQuantized

    qtype = GGMLQuantizationType[type_name]
    torch.manual_seed(0)
    n, k = 384, 512
    w = torch.randn(n, k) * 0.05
    blocks_np = np.empty((n, ggml.row_size(int(qtype), k)), dtype=np.uint8)
    ggml.quantize(int(qtype), w.numpy().ctypes.data, blocks_np.ctypes.data, n, k)
    w_deq = torch.from_numpy(dequantize(blocks_np, qtype).reshape(n, k).astype(np.float32))  # gguf-py's
    method = GGUFLinearMethod(repack=repack)
    method.max_ggml_rows = 10**6
    layer = Linear(k, n, method, shards={"a": 128, "b": 256})  # a fused layer: two shards, one matmul call
    for shard, (a, b) in (("a", (0, 128)), ("b", (128, n))):
        layer.weight.weight_loader(layer.weight, GGUFQuantized(blocks_np[a:b], qtype, (b - a, k)), shard)
    layer.finish_loading()
    x = torch.randn(17, k)
    y = layer(x)
    ref = F.linear(x.double(), w_deq.double()).float()
    err = float((y - ref).norm() / ref.norm())
    assert err < 2e-2, f"{type_name} repack={repack}: relative error {err:.2e}"
    # the thread count changes nothing (layers/thread_choice.py picks one or all per call): ggml splits
    # by output rows, each computed whole by one thread
    for rows in (1, 4, 17):
        xs = x[:rows].contiguous()
        outs = []
        for threads in (1, 2, 3):
            out = torch.empty(rows, n)
            layer.matmul(xs.data_ptr(), rows, out.data_ptr(), threads)
            outs.append(out)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), f"{type_name}: result depends on the thread count"
    # row independence: on plain blocks each row alone gives exactly its row of the batch; ggml's repacked
    # kernels run 4-row tiles and a 1-row path that round differently, so there only closeness holds; on
    # plain K-quant blocks a batch runs in tiles and a row alone by itself, the same products summed in
    # another order, so they must agree to float rounding
    repacked = any(w.repacked for w in layer.matmul.weights)
    for i in (0, 5, 16):
        alone = layer(x[i : i + 1].contiguous())[0]
        if repacked:
            assert torch.allclose(alone, y[i], rtol=2e-2, atol=2e-2 * float(y[i].abs().max()))
        elif type_name in TILED_PLAIN:
            diff = float((alone - y[i]).abs().max()) / float(y[i].abs().max())
            assert diff <= 1e-5, f"{type_name}: row {i} alone differs from its batch row by {diff:.1e}"
        else:
            assert torch.equal(alone, y[i]), f"{type_name}: row {i} depends on the batch"
    # the dense path (dequantize + F.linear) is exact against the same dequantized weight: plain blocks, and
    # ggml's repacked Q4_K, which the shim reads back into plain blocks; other repacked layouts have none
    method.max_ggml_rows = 0
    if repacked and type_name == "Q4_K":
        assert layer.dense_ok, "a repacked Q4_K matrix must still have the dense path"
    if layer.dense_ok:
        assert torch.allclose(layer(x), F.linear(x, w_deq), rtol=1e-5, atol=1e-5), f"{type_name}: the dense path"
    # with a dense copy (--dense-copy) every matrix has the dense path, a repacked one too (the copy is made
    # from the plain blocks before repacking), exact against the same weight; the blocks stay for few rows
    cmethod = GGUFLinearMethod(repack=repack, dense_copy=torch.float32)
    clayer = Linear(k, n, cmethod, shards={"a": 128, "b": 256})
    for shard, (a, b) in (("a", (0, 128)), ("b", (128, n))):
        clayer.weight.weight_loader(clayer.weight, GGUFQuantized(blocks_np[a:b], qtype, (b - a, k)), shard)
    clayer.finish_loading()
    assert clayer.packed is not None and tuple(clayer.packed.shape) == (n, k)
    assert any(w.repacked for w in clayer.matmul.weights) == repacked
    cmethod.max_ggml_rows = 0
    assert torch.allclose(clayer(x), F.linear(x, w_deq), rtol=1e-5, atol=1e-5), f"{type_name}: the dense copy"
    cmethod.max_ggml_rows = 10**6
    assert torch.equal(clayer(x), y), f"{type_name}: below the crossover the copy must not be used"


# the other types a user's GGUF may hold (i-quants, ternary, MXFP4, 16-bit): ggml multiplies them on its
# plain-block path; held to gguf-py's dequantizer as the types above are
OTHER_TYPES = ["F16", "BF16", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS",
               "TQ1_0", "TQ2_0", "MXFP4"]


@pytest.mark.parametrize("type_name", OTHER_TYPES)
def test_one_matmul_per_other_type_against_fp32(type_name: str) -> None:
    """Types ggml's quantizer makes only with an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S) are random blocks
    with a small fp16 scale (every bit pattern of their grid indices and signs is a valid block), the rest
    quantized from random weights; gguf-py's numpy dequantizer is the reference."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    from tokenmill.layers.ggml_linear import GGUFLinearMethod
    from tokenmill.layers.linear import Linear
    from tokenmill.loader.weights import GGUFQuantized

    qtype = GGMLQuantizationType[type_name]
    n, k = 256, 512
    block, size = GGML_QUANT_SIZES[qtype]
    blocks_np = np.empty((n, k // block * size), dtype=np.uint8)
    if ggml.requires_imatrix(int(qtype)):
        blocks_np[:] = np.random.default_rng(0).integers(0, 256, size=blocks_np.shape, dtype=np.uint8)
        blocks_np.reshape(n, -1, size)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    else:
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.05
        ggml.quantize(int(qtype), w.numpy().ctypes.data, blocks_np.ctypes.data, n, k)
    w_deq = torch.from_numpy(dequantize(blocks_np, qtype).reshape(n, k).astype(np.float32))
    assert float(w_deq.abs().max()) > 0
    method = GGUFLinearMethod(repack=False)
    method.max_ggml_rows = 10**6
    layer = Linear(k, n, method)
    layer.weight.weight_loader(layer.weight, GGUFQuantized(blocks_np, qtype, (n, k)), None)
    layer.finish_loading()
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(1))
    ref = F.linear(x.double(), w_deq.double()).float()
    for rows in (1, 9):  # one row and a batch
        y = layer(x[:rows].contiguous())
        err = float((y - ref[:rows]).norm() / ref[:rows].norm())
        assert err < 2e-2, f"{type_name}, {rows} rows: relative error {err:.2e}"


def test_repacked_q4_k_reads_back_as_the_file_blocks() -> None:
    """ggml's repacked Q4_K (8 rows interleaved) read back by the shim: byte for byte the blocks that went in,
    and dequantized rows equal to gguf-py's dequantizer on them, for any 8-row-aligned span."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType.Q4_K
    torch.manual_seed(1)
    n, k = 72, 768
    w = torch.randn(n, k) * torch.logspace(-3, 0, k)  # columns of very different sizes: all scale bits used
    blocks = np.empty((n, ggml.row_size(int(qtype), k)), dtype=np.uint8)
    ggml.quantize(int(qtype), w.numpy().ctypes.data, blocks.ctypes.data, n, k)
    gw = ggml.GgmlWeight(int(qtype), k, n, blocks.ctypes.data, True, blocks)
    if not gw.repacked:
        pytest.skip("this CPU has no repacked Q4_K layout")
    assert gw.dequantizable, f"ggml repacked Q4_K as {gw.layout!r}, which the shim cannot read back"
    assert np.array_equal(gw.plain_blocks(0, n), blocks)
    assert np.array_equal(gw.plain_blocks(16, 24), blocks[16:40])
    ref = torch.from_numpy(dequantize(blocks, qtype).reshape(n, k).astype(np.float32))
    for r0, rows in ((0, n), (8, 16), (64, 8)):
        out = torch.empty(rows, k)
        gw.dequantize_rows(r0, rows, out.data_ptr(), 2)
        assert torch.equal(out, ref[r0 : r0 + rows]), f"rows {r0}..{r0 + rows}"
    with pytest.raises(ValueError, match="cannot dequantize"):
        gw.dequantize_rows(4, 8, torch.empty(8, k).data_ptr())  # not 8-row aligned


def test_repacked_q4_k_on_the_plain_kernel_is_the_plain_weights_result(monkeypatch) -> None:
    """Big batches of a repacked Q4_K matrix may run on ggml's plain-block kernel, its rows read back a tile at
    a time (ggml_linear._plain): exactly what a plain weight of the same blocks gives, whatever the tile
    (scratch of 3 x 8 rows here: tiles of 24, 24, 24 rows and a last one of 8), in a fused layer whose other
    part (Q6_K, as in a Q4_K_M file) is plain; and within ggml's 8-bit rounding of the fp32 product."""
    from gguf import GGMLQuantizationType

    import tokenmill.layers.ggml_linear as gl

    monkeypatch.setenv("TOKENMILL_AMX_K_QUANTS", "0")  # ggml's kernels (the AMX one: the test below)
    monkeypatch.setenv("TOKENMILL_Q4K_PLAIN", "0")  # ggml's repacked layout, not plain blocks for ours
    k, blocks, deq, layer = q4_k_m_layer()
    repacked, plain = layer(True), layer(False)
    if repacked.plain is None:
        pytest.skip("this CPU has no repacked Q4_K layout")
    assert plain.plain is None  # nothing to read back
    monkeypatch.setattr(gl, "_TILE_ELEMS", 3 * 8 * ggml.row_size(int(GGMLQuantizationType.Q4_K), k) // 4)
    x = torch.randn(40, k)
    y = repacked.method._plain(repacked, x)
    plain.method.max_ggml_rows = 10**6
    plain.block_mm = None  # ggml's plain-block kernels, not ours (test_block_matmul.py has those)
    assert torch.equal(y, plain(x))
    ref = F.linear(x.double(), torch.cat(deq).double()).float()
    assert float((y - ref).norm() / ref.norm()) < 2e-2
    # apply() takes it past the crossover once calibration chose it, not before
    repacked.method.max_ggml_rows = 8
    repacked.method._big_plain = True
    assert torch.equal(repacked(x), y)


def q4_k_m_layer():
    """A fused layer as a Q4_K_M file has them: 80 rows of Q4_K and 32 of Q6_K, k = 512 -> (k, blocks, the
    parts dequantized by gguf-py (fp32), layer(repack) building it on a new method)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    import tokenmill.layers.ggml_linear as gl
    from tokenmill.layers.linear import Linear
    from tokenmill.loader.weights import GGUFQuantized

    torch.manual_seed(2)
    k, parts = 512, {"a": (GGMLQuantizationType.Q4_K, 80), "b": (GGMLQuantizationType.Q6_K, 32)}
    blocks, deq = {}, []
    for name, (qtype, rows) in parts.items():
        w = torch.randn(rows, k) * 0.05
        blocks[name] = np.empty((rows, ggml.row_size(int(qtype), k)), dtype=np.uint8)
        ggml.quantize(int(qtype), w.numpy().ctypes.data, blocks[name].ctypes.data, rows, k)
        deq.append(torch.from_numpy(dequantize(blocks[name], qtype).reshape(rows, k).astype(np.float32)))

    def layer(repack: bool) -> Linear:
        lyr = Linear(k, 112, gl.GGUFLinearMethod(repack=repack), shards={"a": 80, "b": 32})
        for name, (qtype, rows) in parts.items():
            lyr.weight.weight_loader(lyr.weight, GGUFQuantized(blocks[name], qtype, (rows, k)), name)
        lyr.finish_loading()
        return lyr

    return k, blocks, deq, layer


def test_q4_k_m_layer_small_batches_on_the_block_kernels(monkeypatch) -> None:
    """A Q4_K_M layer asked to repack keeps its Q4_K in the file's blocks, and small batches of both parts run
    on our K-quant kernel (kquant_matmul.cpp: ~1e-5 of fp64, each row its own bits in any batch), not the AMX
    kernel (TOKENMILL_Q4K_PLAIN=1; the default on CPUs other than AVX-512 without AMX: q4k_plain_here);
    TOKENMILL_Q4K_PLAIN=0 repacks it for ggml's kernels where this CPU has the layout."""
    from tokenmill.layers import ggml_linear

    monkeypatch.setenv("TOKENMILL_Q4K_PLAIN", "1")
    k, blocks, deq, layer = q4_k_m_layer()
    lyr = layer(True)
    x = torch.randn(7, k)
    y = lyr.method._ggml(lyr, x)
    ref = F.linear(x.double(), torch.cat(deq).double())
    assert [p[0] for p in lyr.block_mm] == [12, 14] and not lyr.block_amx
    assert not any(w.repacked for w in lyr.matmul.weights)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-4
    assert not lyr.method.uses_amx(lyr, torch.bfloat16, 7)
    for i in (0, 3, 6):
        assert torch.equal(lyr.method._ggml(lyr, x[i : i + 1]), y[i : i + 1])
    monkeypatch.setenv("TOKENMILL_Q4K_PLAIN", "0")
    again = layer(True)
    if any(w.repacked for w in again.matmul.weights):
        assert again.block_mm is None
        y = again.method._ggml(again, x)
        assert float((y.double() - ref).norm() / ref.norm()) < 2e-2  # ggml's 8-bit activations
    # unset: the CPU's rule; Q6_K (no repacked layout in ggml) stays ours either way
    monkeypatch.delenv("TOKENMILL_Q4K_PLAIN")
    for flags, plain in (({"avx2"}, True), ({"avx2", "avx512f"}, False),
                         ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, True)):
        monkeypatch.setattr(ggml_linear, "cpu_flags", lambda f=frozenset(flags): f)
        assert ggml_linear.q4k_plain_here() == plain
        chosen = layer(True)
        assert chosen.method._keeps_plain(12) == plain and chosen.method._keeps_plain(14)


def test_k_quants_on_the_amx_kernel_for_big_batches(monkeypatch) -> None:
    """At bf16 on AMX, big batches of Q4_K and Q6_K matrices run on the AMX kernel (_plain): a repacked Q4_K one
    read back a tile of 16-row multiples at a time (scratch of 2 x 16 rows here: tiles of 32, 32 and 16), a
    plain one in place, with the same bits either way; within bf16's rounding of the fp64 product of the
    dequantized weights; each row its own bits alone; taken by apply() past the crossover once chosen."""
    from gguf import GGMLQuantizationType

    import tokenmill.layers.ggml_linear as gl

    if not block_matmul.amx_available():
        pytest.skip("no AMX here: K-quants stay on ggml's kernels")
    monkeypatch.setenv("TOKENMILL_Q4K_PLAIN", "0")  # a repacked Q4_K, read back
    k, blocks, deq, layer = q4_k_m_layer()
    repacked, plain = layer(True), layer(False)
    assert plain.plain is not None  # the big-batch path exists for plain K-quant blocks too (on AMX)
    monkeypatch.setattr(gl, "_TILE_ELEMS", 2 * 16 * ggml.row_size(int(GGMLQuantizationType.Q4_K), k) // 4)
    x = torch.randn(70, k).to(torch.bfloat16)  # a 64-row pass and 6 rows
    y = repacked.method._plain(repacked, x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, plain.method._plain(plain, x))
    ref = F.linear(x.double(), torch.cat(deq).double())
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    for i in (0, 17, 69):
        assert torch.equal(repacked.method._plain(repacked, x[i : i + 1]), y[i : i + 1])
    repacked.method.max_ggml_rows = 8
    repacked.method._big_plain = True
    assert torch.equal(repacked(x), y)
    # at fp32 the same layer stays on ggml's plain-block kernels
    monkeypatch.setenv("TOKENMILL_AMX_K_QUANTS", "0")
    ggml_only = layer(False)
    ggml_only.block_mm = None  # (ours: test_block_matmul.py)
    xf = x.float()
    assert torch.equal(plain.method._plain(plain, xf), ggml_only.method._ggml(ggml_only, xf))


def corpus_ids(tokenizer, n: int) -> list[list[int]]:
    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text() + (root / "tokenmill" / "engine" / "scheduler.py").read_text()
    ids = tokenizer.encode(text)
    return [ids[i : i + 250] for i in range(0, min(len(ids), n) - 249, 250)]


def test_default_model_logits_against_the_dequantized_reference(llm) -> None:
    """`llm` is the dequantize engine (conftest); this one keeps the file's Q4_1 / Q8_0 blocks."""
    ours = ggml_engine()
    assert ours.engine.platform.compute.linear_method == "gguf"
    agree = total = 0
    medians = []
    for ids in corpus_ids(llm.tokenizer, 1000):
        ref, got = prompt_logits(llm, ids), prompt_logits(ours, ids)
        rel = (ref - got).norm(dim=-1) / ref.norm(dim=-1)
        medians.append(float(rel.median()))
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
    assert total >= 1000
    assert max(medians) < 1e-3, medians
    assert agree / total >= 0.98, f"teacher-forced top-1 agreement {agree / total:.3f}"


def test_dense_path_is_exactly_the_dequantized_engine(llm) -> None:
    ours = ggml_engine(max_rows=0)  # every matmul dequantizes a tile and runs F.linear
    ids = corpus_ids(llm.tokenizer, 250)[0]
    assert torch.equal(prompt_logits(llm, ids), prompt_logits(ours, ids))


def test_dense_copy_is_exactly_the_dequantized_engine(llm) -> None:
    """--dense-copy on: past the crossover (0 rows here) every matmul, the tied output layer included,
    multiplies by the whole dense copy, the same values as the dequantize engine's weights."""
    ours = ggml_engine(max_rows=0, dense_copy="on")
    assert ours.engine.platform.compute.dense_copy
    head = ours.engine.executor.worker.model.lm_head
    assert head.packed is not None and tuple(head.packed.shape) == (head.out_features, head.in_features)
    ids = corpus_ids(llm.tokenizer, 250)[0]
    assert torch.equal(prompt_logits(llm, ids), prompt_logits(ours, ids))


def test_dense_copy_at_bf16_is_the_dequantized_bf16_engine() -> None:
    """At bf16 (auto's dtype on AMX) the copy is oneDNN-prepacked where the dequantize engine prepacks
    too: the same bf16 weights through the same kernel, so the same logits."""
    ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="bfloat16",
              quantization="dequantize")
    ours = ggml_engine(max_rows=0, dense_copy="on", dtype="bfloat16")
    ids = corpus_ids(ref.tokenizer, 250)[0][:96]  # short: bf16 matmuls are slow where the CPU lacks bf16
    assert torch.equal(prompt_logits(ref, ids), prompt_logits(ours, ids))
    # and it is refused where there are no blocks to copy
    with pytest.raises(ValueError, match="dense_copy on is for GGUF blocks"):
        LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, quantization="dequantize",
            dense_copy="on")


def batched_and_alone(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy token ids of eight short prompts generated in one batch, and each generated alone."""
    prompts = [f"Write two sentences about {s}." for s in ("the ocean", "a violin", "bread", "Mars", "chess",
                                                           "winter", "a river", "jazz")]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    alone = [llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    return batched, alone


def test_batched_equals_alone_on_ggml_kernels(monkeypatch) -> None:
    """Every step stays on ggml's path (max_rows 10**6) and on plain blocks (repacking off: the repacked
    kernels are not row-independent), so row independence makes batched == alone exact."""
    monkeypatch.setenv("TOKENMILL_GGML_REPACK", "0")
    batched, alone = batched_and_alone(ggml_engine())
    assert batched == alone


def test_panel_kernel_against_the_dequantized_reference(llm, monkeypatch) -> None:
    """TOKENMILL_PANEL_MIN_ROWS=1: every matmul on plain blocks (the Q4_1 layers, the Q8_0 head) takes the fp32
    panel kernel, the dequantize engine's own fp32 weights summed in another order: fp32 rounding apart."""
    monkeypatch.setenv("TOKENMILL_PANEL_MIN_ROWS", "1")
    ours = ggml_engine()
    method = ours.engine.executor.worker.model.lm_head.method
    assert method.panel_min_rows == 1
    for ids in corpus_ids(llm.tokenizer, 500):
        ref, got = prompt_logits(llm, ids), prompt_logits(ours, ids)
        rel = (ref - got).norm(dim=-1) / ref.norm(dim=-1)
        assert float(rel.max()) < 1e-4, float(rel.max())
        assert float((ref.argmax(-1) == got.argmax(-1)).float().mean()) >= 0.99


def test_batched_equals_alone_on_the_panel_kernel(monkeypatch) -> None:
    """Every step on the panel kernel, decode steps included (the native step's kernel table takes it from
    panel_min_rows rows): each output row is one fma chain over its own input row, so batched == alone
    exactly."""
    monkeypatch.setenv("TOKENMILL_GGML_REPACK", "0")
    monkeypatch.setenv("TOKENMILL_PANEL_MIN_ROWS", "1")
    batched, alone = batched_and_alone(ggml_engine())
    assert batched == alone
    # and the panel kernel's greedy text is the block kernels' (16-bit x) on these prompts
    monkeypatch.delenv("TOKENMILL_PANEL_MIN_ROWS")
    blocks = ggml_engine()
    assert blocks.engine.executor.worker.model.lm_head.method.panel_min_rows is None
    assert batched_and_alone(blocks)[0] == batched


@pytest.fixture(scope="module")
def random_files(tmp_path_factory) -> dict[str, Path]:
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    d = tmp_path_factory.mktemp("gguf")
    return {mix: write_random_gguf(d / f"{mix}.gguf", Shape(), mix, std=0.03)
            for mix in ("q4_0", "q8_0", "q4_k_m", "q5_k_m", "q6_k")}


@pytest.mark.parametrize("mix", ["q4_0", "q8_0", "q4_k_m", "q5_k_m", "q6_k"])
def test_random_model_per_quant_type(mix: str, random_files: dict[str, Path]) -> None:
    from tokenmill.loader.gguf import GGUFFile

    path = random_files[mix]
    types = {t.ggml_type.name for t in GGUFFile(path).tensors.values() if len(t.shape) == 2}
    if mix.endswith("_m"):
        assert types == {mix[:4].upper(), "Q6_K"}, types
    ref = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")
    ours = ggml_engine(str(path), kv_cache_memory=16 * 2**20)
    ids = ref.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)
    a, b = prompt_logits(ref, ids), prompt_logits(ours, ids)
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
    assert float(rel.max()) < 5e-2, f"{mix}: max relative logit error {float(rel.max()):.2e}"
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.85
    lins = [m for m in ours.engine.executor.worker.model.modules() if isinstance(getattr(m, "method", None),
                                                                                    GGUFLinearMethod)]
    if all(lyr.block_mm is not None for lyr in lins):  # all on our kernels (16-bit activations): the weights' own
        assert float(rel.max()) < 1e-3, f"{mix} on the block kernels: max relative logit error {float(rel.max()):.2e}"
        assert bool((a.argmax(-1) == b.argmax(-1)).all())
    # the plan counts the file's own bytes
    matrix_bytes = sum(t.num_bytes for t in GGUFFile(path).tensors.values() if len(t.shape) == 2)
    assert matrix_bytes <= ours.engine.plan.weight_bytes < matrix_bytes + 2**20


@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m"])
def test_k_quant_prompts_on_the_amx_kernel_at_bf16(mix: str, random_files: dict[str, Path], monkeypatch) -> None:
    """A K-quant file at bf16 on AMX, no dense copy (as a 7B file loads), its prompt rows forced onto the
    big-batch path (_plain: the AMX kernel on Q4_K / Q5_K / Q6_K blocks): logits within bf16's rounding of the
    fp32 dequantized reference."""
    from tokenmill.layers.ggml_linear import GGUFLinearMethod

    calls = []
    amx_blocks = GGUFLinearMethod._amx_blocks
    monkeypatch.setattr(GGUFLinearMethod, "_amx_blocks",
                        lambda self, w, *a: calls.append(w.ggml_type) or amx_blocks(self, w, *a))

    if not block_matmul.amx_available():
        pytest.skip("no AMX here: K-quants stay on ggml's kernels")
    path = random_files[mix]
    ref = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")
    ours = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="bfloat16",
               dense_copy="off")
    model = ours.engine.executor.worker.model
    methods = {id(m): m for m in (getattr(mod, "method", None) for mod in model.modules())
               if isinstance(m, GGUFLinearMethod)}
    lins = [mod for mod in model.modules() if isinstance(getattr(mod, "method", None), GGUFLinearMethod)]
    assert methods and any(lyr.plain is not None for lyr in lins)
    for m in methods.values():  # every prompt row of more than 8 on the big-batch path
        m.max_ggml_rows, m._big_plain = 8, True
    ids = ref.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)
    a, b = prompt_logits(ref, ids), prompt_logits(ours, ids)
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
    assert float(rel.max()) < 5e-2, f"{mix}: max relative logit error {float(rel.max()):.2e}"
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.85
    assert {int(t) for t in calls} == {13 if mix == "q5_k_m" else 12, 14}  # its K-quant and Q6_K, on AMX


def test_requantize_an_unquantized_checkpoint(tmp_path: Path, llm) -> None:
    """--quantization q8_0 / q4_0 on an HF directory (the default model converted to fp32 safetensors):
    ggml's quantizer at load, then its kernels; logits close to the fp32 checkpoint's."""
    from tokenmill.cli import main

    out = tmp_path / "hf"
    assert main(["convert", "default", str(out)]) == 0
    ref = LLM(str(out), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
    ids = corpus_ids(llm.tokenizer, 250)[0]
    a = prompt_logits(ref, ids)
    for qtype, bound in (("q8_0", 4e-2), ("q4_0", 0.25)):
        ours = ggml_engine(str(out), quantization=qtype, kv_cache_memory=16 * 2**20)
        assert ours.engine.platform.compute.requant_type == qtype
        b = prompt_logits(ours, ids)
        rel = float(((a - b).norm(dim=-1) / a.norm(dim=-1)).median())
        assert rel < bound, f"{qtype}: median relative logit error {rel:.2e}"
        # q8_0 holds ~1.06 bytes per weight: the plan says so (tied head shares the embedding's blocks)
        if qtype == "q8_0":
            n = ours.engine.model_config.num_parameters()
            assert ours.engine.plan.weight_bytes < 1.1 * n


def test_requantize_a_quantized_gguf(llm, caplog) -> None:
    """--quantization q8_0 on the default Q4_1 / Q8_0 file: every matrix is held as q8_0 (the Q4_1 ones
    requantized from their dequantized values, with a warning that names the types; the Q8_0 embedding kept as
    it is), the plan counts q8_0's bytes, and the logits stay close to the file's own dequantized ones. It was
    silently the file's Q4_1 blocks."""
    import logging

    from tokenmill.layers.ggml_linear import _type_name

    with caplog.at_level(logging.WARNING, logger="tokenmill.worker.worker"):
        ours = ggml_engine(quantization="q8_0")
    assert ours.engine.platform.compute.requant_type == "q8_0"
    assert any("q4_1 matrices to q8_0" in r.getMessage() for r in caplog.records), caplog.text
    lins = [m for m in ours.engine.executor.worker.model.modules() if isinstance(getattr(m, "method", None),
                                                                                  GGUFLinearMethod)]
    assert lins and {_type_name(m).split()[-1] for m in lins} == {"q8_0"}
    n = ours.engine.model_config.num_parameters()
    assert 1.0 * n < ours.engine.plan.weight_bytes < 1.1 * n  # q8_0: 34 bytes a 32 weights (Q4_1: 20)
    ids = corpus_ids(llm.tokenizer, 250)[0]
    a, b = prompt_logits(llm, ids), prompt_logits(ours, ids)
    rel = float(((a - b).norm(dim=-1) / a.norm(dim=-1)).median())
    assert rel < 4e-2, f"median relative logit error {rel:.2e}"


def test_decode_steps_stay_on_the_blocks_up_to_the_row_tile(monkeypatch) -> None:
    """A calibrated crossover below 8 rows (bf16 on AMX measures 1) still lets decode-only steps of up to 8
    rows run as one native call on the blocks (speculative verification, small batches); a fixed
    TOKENMILL_GGML_MAX_ROWS is taken as it is, for A/B runs."""
    from gguf import GGMLQuantizationType

    from tokenmill.layers.ggml_linear import GGUFLinearMethod

    qtype = GGMLQuantizationType.Q4_1
    n, k = 256, 256
    w = torch.randn(n, k) * 0.05
    blocks_np = np.empty((n, ggml.row_size(int(qtype), k)), dtype=np.uint8)
    ggml.quantize(int(qtype), w.numpy().ctypes.data, blocks_np.ctypes.data, n, k)

    def method_and_layers(fixed: str | None) -> tuple[GGUFLinearMethod, list[Linear]]:
        if fixed is None:
            monkeypatch.delenv("TOKENMILL_GGML_MAX_ROWS", raising=False)
        else:
            monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", fixed)
        method = GGUFLinearMethod(repack=False, dense_copy=torch.float32)
        return method, _loaded_layers(method, blocks_np, qtype, n, k)

    method, layers = method_and_layers(None)
    method.calibrate(layers, torch.float32)
    assert method.max_ggml_rows >= 1
    assert method.max_step_rows == max(method.max_ggml_rows, 8)
    from tokenmill.native import block_matmul
    if block_matmul.amx_available() and block_matmul.amx_supports(n):  # bf16 on AMX: the AMX kernel's 64 rows
        method, layers = method_and_layers(None)
        method.calibrate(layers, torch.bfloat16)
        assert method.max_step_rows == max(method.max_ggml_rows, 64)
    method, layers = method_and_layers("2")
    method.calibrate(layers, torch.float32)
    assert method.max_ggml_rows == 2 and method.max_step_rows == 2


def _loaded_layers(method, blocks_np: np.ndarray, qtype, n: int, k: int, count: int = 2) -> list:
    """`count` (n, k) layers of `method`, each loaded with the same GGUF blocks."""
    from tokenmill.layers.linear import Linear
    from tokenmill.loader.weights import GGUFQuantized

    layers = []
    for _ in range(count):
        lyr = Linear(k, n, method)
        lyr.weight.weight_loader(lyr.weight, GGUFQuantized(blocks_np, qtype, (n, k)), None)
        lyr.finish_loading()
        layers.append(lyr)
    return layers


def test_calibration_is_reused_for_an_equal_key_only(monkeypatch) -> None:
    """A second method on layers of the same shapes takes the first one's crossover without timing anything
    (the same decisions); a different TOKENMILL_* setting, or another dtype, measures again."""
    from gguf import GGMLQuantizationType

    from tokenmill.layers import ggml_linear
    from tokenmill.layers.calibration_cache import CalibrationCache
    from tokenmill.layers.ggml_linear import GGUFLinearMethod

    monkeypatch.delenv("TOKENMILL_CALIBRATION_CACHE", raising=False)
    monkeypatch.setattr(ggml_linear, "CALIBRATIONS", CalibrationCache())  # none from other tests
    timed = []
    real = ggml_linear._best_time
    monkeypatch.setattr(ggml_linear, "_best_time", lambda fn, reps=3: timed.append(1) or real(fn, 1))
    qtype, n, k = GGMLQuantizationType.Q4_1, 128, 256
    blocks_np = np.empty((n, ggml.row_size(int(qtype), k)), dtype=np.uint8)
    ggml.quantize(int(qtype), (torch.randn(n, k) * 0.05).numpy().ctypes.data, blocks_np.ctypes.data, n, k)

    def calibrated(dtype: torch.dtype = torch.float32) -> GGUFLinearMethod:
        method = GGUFLinearMethod(repack=False, dense_copy=torch.float32)
        method.calibrate(_loaded_layers(method, blocks_np, qtype, n, k), dtype)
        return method

    first = calibrated()
    assert timed
    timed.clear()
    second = calibrated()
    assert not timed
    assert (second.max_ggml_rows, second.panel_min_rows, second.max_step_rows) == \
        (first.max_ggml_rows, first.panel_min_rows, first.max_step_rows)
    monkeypatch.setenv("TOKENMILL_GGML_REPACK", "0")  # a setting the key holds (even one this path ignores)
    calibrated()
    assert timed


def test_calibration_times_the_kernels_on_all_threads(monkeypatch) -> None:
    """The crossover compares the block kernels with the dense path (all of torch's threads) on equal terms:
    every kernel call calibration times gets the whole team, not the thread chooser's first one-thread calls
    of a new size class (which put the crossover at 1 row instead of 32 in one start on the AMX Xeon); the
    method's own chooser is back afterwards."""
    from gguf import GGMLQuantizationType

    from tokenmill.layers import ggml_linear
    from tokenmill.layers.calibration_cache import CalibrationCache
    from tokenmill.layers.ggml_linear import GGUFLinearMethod

    monkeypatch.delenv("TOKENMILL_CALIBRATION_CACHE", raising=False)
    monkeypatch.setattr(ggml_linear, "CALIBRATIONS", CalibrationCache())  # measured here, not reused
    threads = []
    real = ggml_linear.block_matmul.matmul
    monkeypatch.setattr(ggml_linear.block_matmul, "matmul",
                        lambda *a, **kw: threads.append(a[8]) or real(*a, **kw))  # a[8]: the thread count
    qtype, n, k = GGMLQuantizationType.Q4_1, 128, 256
    blocks_np = np.empty((n, ggml.row_size(int(qtype), k)), dtype=np.uint8)
    ggml.quantize(int(qtype), (torch.randn(n, k) * 0.05).numpy().ctypes.data, blocks_np.ctypes.data, n, k)
    method = GGUFLinearMethod(repack=False, dense_copy=torch.float32)
    layers = _loaded_layers(method, blocks_np, qtype, n, k)
    team = torch.get_num_threads()
    torch.set_num_threads(2)  # a team to choose from (the suite runs one thread a test process on 2 cores)
    try:
        chooser = method.threads
        method.calibrate(layers, torch.float32)
        assert method.threads is chooser
    finally:
        torch.set_num_threads(team)
    assert threads and set(threads) == {2}


def test_head_stays_on_its_kernels_for_verification_rows_whatever_the_crossover() -> None:
    """With the crossover to the dense path at 1 row (calibration has put it anywhere from 1 to 64 on one
    host), the head still takes up to 16 rows (speculative verification: 2 requests x 7) on its kernels, so
    their logits are fp32 and equal a one-row call's on the block kernel below the AMX crossover; the other
    layers go dense from 2 rows."""
    llm = ggml_engine(max_rows=1, dtype="bfloat16")
    model = llm.engine.executor.worker.model
    head = model.lm_head
    assert head.block_mm is not None and head.wide_out
    for m in (2, 7, 16):
        h = (torch.randn(m, head.in_features) * 2).to(torch.bfloat16)
        logits = model.compute_logits(h, float32=False)
        assert logits.dtype == torch.float32, m
        if not head.method.uses_amx(head, torch.bfloat16, m):  # the block kernel: row by row as alone
            alone = torch.cat([model.compute_logits(h[i : i + 1], float32=False) for i in range(m)])
            assert torch.equal(logits, alone), m
    h = (torch.randn(17, head.in_features) * 2).to(torch.bfloat16)
    if head.dense_ok or head.packed is not None:  # past 16 rows: the dense path, at bf16
        assert model.compute_logits(h, float32=False).dtype == torch.bfloat16
    q_proj = model.model.layers[0].self_attn.qkv_proj
    assert q_proj(h[:2]).dtype == torch.bfloat16


def test_head_logits_stay_fp32_at_bf16() -> None:
    """At bf16 the output head returns its kernel's fp32 values instead of rounding them to bf16: rounded
    logits tie (the default model's first answer token to "What is the capital of France?" was an exact
    tie between "The" and "L" at bf16, decided by token id, where fp32 puts "The" 0.08 ahead). The other
    layers still give bf16."""
    llm = ggml_engine(max_rows=64, dtype="bfloat16")  # a fixed crossover: the head's few rows on the blocks
    model = llm.engine.executor.worker.model
    head = model.lm_head
    assert head.block_mm is not None and head.wide_out
    h = (torch.randn(3, head.in_features) * 2).to(torch.bfloat16)
    logits = model.compute_logits(h, float32=False)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, head(h.float()))  # the block kernel's own fp32 result on the same rows
    assert not torch.equal(logits, logits.bfloat16().float())  # not rounded
    q_proj = model.model.layers[0].self_attn.qkv_proj
    assert q_proj(h).dtype == torch.bfloat16
    if block_matmul.amx_available() and head.block_amx:  # from AMX_MIN_ROWS rows: the AMX kernel's fp32 entry
        m = block_matmul.AMX_MIN_ROWS + 2
        h = (torch.randn(m, head.in_features) * 2).to(torch.bfloat16)
        logits = model.compute_logits(h, float32=False)
        ref = torch.empty(m, head.out_features)
        x32 = h.float().contiguous()
        for qtype, wp, n, off in head.block_mm:
            block_matmul.matmul(qtype, wp, n, head.in_features, x32.data_ptr(), m, ref.data_ptr() + 4 * off,
                                head.out_features, 2, amx=True)
        assert logits.dtype == torch.float32 and torch.equal(logits, ref)
