"""native/vnni_matmul.cpp, the panel kernels on AVX512-VNNI for plain Q4_0 / Q4_1 / Q8_0 blocks (the gguf
method's panel kernel at bf16 on CPUs with VNNI and no AMX), x at 16 bits (the default) or 8 (llama.cpp's,
opt-in). Their arithmetic: x quantized per 32-block (d = max|x| / (2^(bits-1) - 1), q = round-half-even(x /
d)), integer products with the weights' quants, the blocks' scales applied in fp32. So each is checked two
ways: against that arithmetic done in fp64 on gguf-py's dequantized weights (within fp32 rounding: a wrong
layout, lane or scale is far off), and against the unrounded fp64 product (at 8 bits the one-matmul bound of
the gguf method's tests, 2e-2; at 16 bits 1e-4, finer than a bf16 copy of the weights). Each row's result is
the same bits alone or in any batch, at any thread count. Skipped where the kernels are not built (a CPU
without AVX512-VNNI: the entries then hand the call to the fp32 panel kernel).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_blocks import multiply, quantized

from tokenmill.native import block_matmul

pytestmark = pytest.mark.skipif(not block_matmul.vnni_built(), reason="the VNNI kernel runs on AVX512-VNNI")


def rounded_x(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x (m, k) as the kernel rounds it: per 32-block q * d, in fp64 (the fp32 steps as the kernel takes them)."""
    top = np.float32(2 ** (bits - 1) - 1)
    xb = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    inv = np.where(amax > 0, top / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    d = (amax / top).astype(np.float32)
    return torch.from_numpy((q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape))


BOUND = {8: (2e-2, 1e-2), 16: (1e-4, 5e-5)}  # bits -> (max, median) relative error against the unrounded product


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n,k", [(37, 96), (64, 576), (48, 1536)])
def test_against_its_arithmetic_and_the_unrounded_product(type_name: str, n: int, k: int, bits: int) -> None:
    """n = 37: a partial last panel; 300 rows: past the kernel's 256-row chunk, with tiles of 8 and a tail."""
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(300, k, generator=g)
    x[1] = 0.0  # a zero row (scale 0)
    x[2, :32] *= 40.0  # an outlier block
    y = multiply(qtype, blocks, x, threads=2, vnni=bits).double()
    emulated = rounded_x(x, bits) @ w.T
    ref = x.double() @ w.T
    scale = ref.norm(dim=1).clamp_min(1e-30)
    assert torch.equal(y[1], torch.zeros(n, dtype=torch.float64)) and torch.equal(y[:, 0], torch.zeros(300).double())
    err = float(((y - emulated).norm(dim=1) / scale).max())
    assert err < 1e-5, f"{type_name}: {err:.2e} from the kernel's own arithmetic"
    rel = (y - ref).norm(dim=1) / scale
    rel[1] = 0.0
    worst, typical = BOUND[bits]
    assert float(rel.max()) < worst and float(rel.median()) < typical, f"{type_name}: {float(rel.max()):.2e} unrounded"


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_a_row_gives_the_same_bits_alone_or_batched(type_name: str, bits: int) -> None:
    qtype, blocks, _ = quantized(type_name, 70, 256, seed=5)
    x = torch.randn(23, 256, generator=torch.Generator().manual_seed(6))
    whole = multiply(qtype, blocks, x, threads=2, vnni=bits)
    for start, m in ((0, 1), (5, 3), (7, 9), (22, 1)):
        part = multiply(qtype, blocks, x[start : start + m], threads=1 + m % 3, vnni=bits)
        assert torch.equal(part, whole[start : start + m])


@pytest.mark.parametrize("bits", [8, 16])
def test_honours_the_row_stride_of_x_and_hands_other_types_on(bits: int) -> None:
    lib = block_matmul.library()
    qtype, blocks, _ = quantized("Q4_1", 20, 64, seed=1)
    wide = torch.randn(7, 100)
    y = torch.empty(7, 20)
    entry = getattr(lib, block_matmul.panel_entry(bits))
    assert entry(qtype, blocks.ctypes.data, 20, 64, wide.data_ptr(), 100, 7, y.data_ptr(), 20, 2) == 0
    assert torch.equal(y, multiply(qtype, blocks, wide[:, :64], vnni=bits))
    # a K-quant: the block kernel's result, as the fp32 panel entry gives it
    kq, kblocks, _ = quantized("Q4_K", 16, 256, seed=2)
    x = torch.randn(12, 256)
    assert torch.equal(multiply(kq, kblocks, x, vnni=bits), multiply(kq, kblocks, x))


def packed(qtype: int, blocks: np.ndarray, parts: tuple[int, ...] = ()) -> np.ndarray:
    """blocks (n, row bytes) in the packed layout, packed in parts of these many rows (multiples of 16) and the
    rest, as the gguf method packs a fused layer's shards -> a 64-byte-aligned uint8 buffer."""
    n, k = blocks.shape[0], blocks.shape[1] // {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 20: 18}[qtype] * 32
    total = block_matmul.packed_bytes(qtype, n, k)
    buf = np.empty(total + 64, np.uint8)
    out = buf[-buf.ctypes.data % 64:][:total]
    r0, at = 0, out.ctypes.data
    for rows in (*parts, n - sum(parts)):
        block_matmul.pack(qtype, blocks[r0:].ctypes.data, rows, k, at)
        at += block_matmul.packed_bytes(qtype, rows, k)
        r0 += rows
    return out


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n,parts", [(37, ()), (64, (16, 32)), (80, (48,))])
def test_the_packed_layout_gives_the_plain_blocks_bits(type_name: str, n: int, parts: tuple[int, ...]) -> None:
    """The packed layout is the plain blocks reordered: each VNNI entry gives the same bits on it (a type code
    with PACKED) as on the plain blocks, whole or packed in parts, a few rows (read straight from the packed
    bytes) or many; the block kernel's entry, the fp32 panel's and the grouped one take the 16-bit kernel for
    a packed code; the library says it supports the codes."""
    k = 96
    qtype, blocks, _ = quantized(type_name, n, k, seed=n)
    p = packed(qtype, blocks, parts)
    assert block_matmul.supports(block_matmul.PACKED | qtype)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(4))  # past DIRECT_ROWS: the panel path
    code = block_matmul.PACKED | qtype
    plain16 = multiply(qtype, blocks, x, threads=2, vnni=16)
    assert torch.equal(multiply(code, p, x, rows=n, threads=2, vnni=16), plain16)
    assert torch.equal(multiply(code, p, x, rows=n, threads=2, vnni=8), multiply(qtype, blocks, x, threads=2, vnni=8))
    assert torch.equal(multiply(code, p, x, rows=n, threads=2), plain16)  # the block kernel's entry
    assert torch.equal(multiply(code, p, x, rows=n, threads=1, panel=True), plain16)  # the fp32 panel's
    for m in (1, 2, 3, 4, 9, 19):  # up to 32 rows: straight from the packed bytes, no panel (the same bits)
        for threads in (1, 2):
            assert torch.equal(multiply(code, p, x[:m], rows=n, threads=threads), plain16[:m])
    y = torch.empty(40, n)
    block_matmul.matmul_grouped(code, [p.ctypes.data, p.ctypes.data], [7, 33], n, k, x.contiguous().data_ptr(),
                                y.data_ptr(), 2)
    assert torch.equal(y, plain16)


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1", "IQ4_NL"])
@pytest.mark.parametrize("n,k,parts", [(37, 96, ()), (80, 576, (48,))])
def test_blocks_only_packed(type_name: str, n: int, k: int, parts: tuple[int, ...]) -> None:
    """Q5_0 / Q5_1 / IQ4_NL (Q4_K's, Q5_K's and Q3_K's stand-ins where a row is not a multiple of 256: most of
    Gemma 3 270M's and 1B's matrices in a K-quant file) have no plain-block kernel of ours, only the packed layout
    (Q5's qh word as a fifth vector; IQ4_NL's nibbles looked up in its table): each entry against the kernel's own arithmetic (x rounded per 32-block) in fp64 on
    gguf-py's dequantized weights and against the unrounded product, at 16 bits and 8; a few rows (straight from
    the packed bytes) the same bits as in a batch of 300 (the panel, past the 256-row chunk) at any thread count;
    the block kernel's, the fp32 panel's and the grouped entries the 16-bit kernel's result; rows read back as
    the file's blocks (a tied embedding's gather). The plain codes stay unsupported (ggml's)."""
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    p = packed(qtype, blocks, parts)
    code = block_matmul.PACKED | qtype
    assert block_matmul.supports(code) and not block_matmul.supports(qtype)
    assert p.nbytes == -(-n // 16) * (k // 32) * {"Q5_0": 384, "Q5_1": 384, "IQ4_NL": 320}[type_name]  # VNNI_PACKED_PIECE
    g = torch.Generator().manual_seed(k)
    x = torch.randn(300, k, generator=g)
    x[1] = 0.0
    x[2, :32] *= 40.0
    ref = x.double() @ w.T
    scale = ref.norm(dim=1).clamp_min(1e-30)
    for bits in (16, 8):
        y = multiply(code, p, x, rows=n, threads=2, vnni=bits).double()
        assert torch.equal(y[1], torch.zeros(n, dtype=torch.float64))
        err = float(((y - rounded_x(x, bits) @ w.T).norm(dim=1) / scale).max())
        assert err < 1e-5, f"{type_name} at {bits} bits: {err:.2e} from the kernel's own arithmetic"
        rel = (y - ref).norm(dim=1) / scale
        rel[1] = 0.0
        worst, typical = BOUND[bits]
        assert float(rel.max()) < worst and float(rel.median()) < typical, f"{float(rel.max()):.2e} unrounded"
    y16 = multiply(code, p, x, rows=n, threads=2, vnni=16)
    for m, start in ((1, 0), (3, 5), (19, 40), (32, 200)):
        for threads in (1, 2):
            assert torch.equal(multiply(code, p, x[start : start + m], rows=n, threads=threads), y16[start : start + m])
    assert torch.equal(multiply(code, p, x[:40], rows=n, threads=1, panel=True), y16[:40])  # the fp32 panel's entry
    y = torch.empty(40, n)
    xc = x[:40].contiguous()
    block_matmul.matmul_grouped(code, [p.ctypes.data, p.ctypes.data], [7, 33], n, k, xc.data_ptr(), y.data_ptr(), 2)
    assert torch.equal(y, y16[:40])
    ids = torch.tensor([0, n - 1, 17, 17, n // 2])
    rows = np.empty((len(ids), blocks.shape[1]), np.uint8)
    block_matmul.unpack_rows(qtype, p.ctypes.data, n, k, ids.data_ptr(), len(ids), rows.ctypes.data)
    assert np.array_equal(rows, blocks[ids.numpy()])


def assert_near_the_fp32_model(ours, median_error: float, top1: float) -> None:
    """The default model's teacher-forced logits on 1,000 tokens of the repo's text against the fp32 dequantized
    reference: each prompt's median relative error under `median_error`, argmax agreement at least `top1`."""
    from raw_forward import prompt_logits
    from test_gguf_method import corpus_ids

    from tokenmill import LLM

    ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")
    agree = total = 0
    for ids in corpus_ids(ref.tokenizer, 1000):
        a, b = prompt_logits(ref, ids), prompt_logits(ours, ids).float()
        rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
        assert float(rel.median()) < median_error
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= top1, f"teacher-forced top-1 agreement {agree / total:.3f}"


def test_the_method_takes_16_bits_by_default_keeping_the_dense_copy(monkeypatch) -> None:
    """By default at bf16 (on this CPU: VNNI, no AMX) the panel is the 16-bit kernel, in the layer path and the
    native step's table, and the decoder's blocks are packed for it; the dense copy stays (the 16-bit panel is
    slower past ~32 rows); at fp32 the fp32 panel; TOKENMILL_VNNI_MATMUL=0 the fp32 panel at bf16 too. With every prompt row on the panel the default
    model's teacher-forced logits match the fp32 dequantized reference at least as well as the bf16 copy's."""
    if block_matmul.amx_available():
        pytest.skip("on AMX the AMX kernel takes bf16 batches")
    import ctypes

    from tokenmill import LLM
    from tokenmill.native import decode_step

    monkeypatch.delenv("TOKENMILL_VNNI_MATMUL", raising=False)
    assert block_matmul.vnni_bits() == 16
    monkeypatch.setenv("TOKENMILL_PANEL_MIN_ROWS", "1")
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", str(10**6))
    # the copy asked for: on a VNNI CPU whose torch cannot prepack bf16, auto would keep none (and pack nothing)
    ours = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="bfloat16", dense_copy="on")
    assert ours.engine.platform.compute.dense_copy
    model = ours.engine.executor.worker.model
    method = model.lm_head.method
    assert method.vnni_panel(torch.bfloat16) == 16 and method.vnni_panel(torch.float32) == 0
    # the decoder's Q4_1 matrices in the packed layout (no plain blocks nor ggml matrices kept), and the tied
    # head's Q8_0 one, which the embedding then gathers from
    layer = model.model.layers[0]
    for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert lin.matmul is None and all(p[0] == block_matmul.PACKED | 3 for p in lin.block_mm), lin.block_mm
    assert model.lm_head.block_mm[0][0] == block_matmul.PACKED | 8 and model.lm_head.matmul is None
    assert model.model.embed_tokens.packed_rows is not None
    table = decode_step.kernel_table(1, method.vnni_panel(torch.bfloat16))
    assert table.panel_matmul == ctypes.cast(block_matmul.library().tm_vnni16_matmul, ctypes.c_void_p).value
    assert_near_the_fp32_model(ours, median_error=1.5e-2, top1=0.97)
    monkeypatch.setenv("TOKENMILL_VNNI_MATMUL", "0")
    assert block_matmul.vnni_bits() == 0


def test_the_method_takes_it_at_bf16_only_and_drops_the_dense_copy(monkeypatch) -> None:
    """Asked for (TOKENMILL_VNNI_MATMUL=1), on this CPU (VNNI; no AMX, or the test is skipped) at bf16 the
    default model keeps no dense copy (the
    panel takes every Q4_1 / Q8_0 matrix), the method's panel and the native step's are the VNNI kernel, and
    teacher-forced logits stay near the fp32 dequantized reference (measured: top-1 0.958 against the dense
    bf16 copy's 0.975 on 2,000 tokens; benchmarks/experiments/vnni_agreement.py); at fp32 the fp32 panel."""
    if block_matmul.amx_available():
        pytest.skip("on AMX the AMX kernel takes bf16 batches")
    from tokenmill import LLM
    from tokenmill.native import decode_step

    monkeypatch.setenv("TOKENMILL_PANEL_MIN_ROWS", "1")
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", str(10**6))
    assert not block_matmul.vnni_available()  # opt-in
    monkeypatch.setenv("TOKENMILL_VNNI_MATMUL", "1")
    ours = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="bfloat16")
    assert not ours.engine.platform.compute.dense_copy
    method = ours.engine.executor.worker.model.lm_head.method
    assert method.vnni_panel(torch.bfloat16) == 8 and method.vnni_panel(torch.float32) == 0
    table = decode_step.kernel_table(1, method.vnni_panel(torch.bfloat16))
    lib = block_matmul.library()
    import ctypes
    assert table.panel_matmul == ctypes.cast(lib.tm_vnni_matmul, ctypes.c_void_p).value
    assert_near_the_fp32_model(ours, median_error=3e-2, top1=0.93)


def test_the_planner_counts_the_packed_layout_as_the_library_sizes_it() -> None:
    """compute.vnni_packed_bytes (torch-free, for the memory plan) is the library's packed size."""
    from tokenmill.compute import vnni_packed_bytes

    for name, qtype in (("q4_0", 2), ("q4_1", 3), ("q5_0", 6), ("q5_1", 7), ("q8_0", 8), ("iq4_nl", 20)):
        for n, k in ((37, 96), (64, 576), (1536, 576), (49152, 576)):
            assert vnni_packed_bytes(n, k, name) == block_matmul.packed_bytes(qtype, n, k)
    assert vnni_packed_bytes(64, 256, "q4_k") is None


@pytest.mark.parametrize("mix,tied,copy", [("q4_0", False, "on"), ("q8_0", False, "on"), ("q8_0", True, "on"),
                                           ("q5_0", False, "on"), ("q5_1", True, "on"), ("iq4_nl", False, "on"),
                                           ("q8_0", True, "off"), ("q5_0", False, "off")])
def test_the_memory_plan_counts_the_packed_blocks(mix: str, tied: bool, copy: str, tmp_path) -> None:
    """Where the blocks are packed (bf16, the 16-bit VNNI panel, with the dense copy or without it: the decoder's
    and the output layer's, not an untied embedding's), the engine's memory plan and `tokenmill plan` count the
    packed bytes (Q4_0 +11%, Q5_0 +9%, Q8_0 +6% over the file's; Q5_1 the same), not the file's: weights = the
    plain plan's - the packed matrices' file bytes + the buffers the method holds. A tied embedding gathers its
    rows from the packed head: the same values as from the file's blocks. Without the copy the packed blocks take
    every batch: a prompt's big ones too, with the same greedy tokens as the plain blocks give."""
    if block_matmul.vnni_bits() != 16:
        pytest.skip("the blocks are packed where the 16-bit VNNI kernel is the bf16 panel (no AMX)")
    import dataclasses

    from tokenmill import LLM
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf
    from tokenmill.entrypoints.plan import plan_model
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.memory_plan import make_plan

    path = write_random_gguf(tmp_path / f"{mix}.gguf", Shape(tied=tied), mix, std=0.03)
    llm = LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="bfloat16",
              dense_copy=copy)
    engine, model = llm.engine, llm.engine.executor.worker.model
    assert engine.platform.compute.dense_copy == (copy == "on")
    assert engine.platform.compute.vnni_pack
    linears = [lin for lin in model.modules() if getattr(lin, "block_mm", None) is not None]
    assert model.lm_head in linears and all(p[0] & block_matmul.PACKED for lin in linears for p in lin.block_mm)
    held = sum(b.nbytes - 64 for lin in linears for b in lin.packed_blocks)
    gf = GGUFFile(path)
    head = "token_embd.weight" if tied else "output.weight"
    file_bytes = sum(t.num_bytes for name, t in gf.tensors.items()
                     if len(t.shape) == 2 and (name.startswith("blk.") or name == head))
    matrices = gf.matrices()
    embed = model.model.embed_tokens
    assert (embed.packed_rows is not None) == tied
    ids = torch.tensor([0, 5, 17, 4095, 49151, 17, 300])
    from tokenmill.native import ggml
    table = gf.tensors["token_embd.weight"]
    want = torch.empty(len(ids), table.shape[1])
    raw = np.ascontiguousarray(gf.raw("token_embd.weight"))
    ggml.get_rows(int(table.ggml_type), raw.ctypes.data, table.shape[1], ids.data_ptr(), len(ids), want.data_ptr())
    del raw
    assert torch.equal(embed(ids), want.to(embed.weight.dtype))
    gf.close()
    plain = make_plan(engine.model_config, dataclasses.replace(engine.platform.compute, vnni_pack=False), 16,
                      16 * 2**20, 256, matrices)
    assert (held == file_bytes) == (mix == "q5_1")  # Q4_0, Q5_0, Q8_0 and IQ4_NL grow when packed
    assert engine.plan.weight_bytes == plain.weight_bytes - file_bytes + held
    _, _, planned = plan_model(str(path), "cpu", "bfloat16", None, 16, 16 * 2**20, 256, None, dense_copy=copy)
    assert planned.weight_bytes == engine.plan.weight_bytes
    if copy == "off":  # a 100-row prompt on the packed blocks (the panel path) against the fp32 dequantized model
        from raw_forward import prompt_logits

        ids = torch.randint(100, 40000, (100,), generator=torch.Generator().manual_seed(3)).tolist()
        got = prompt_logits(llm, ids).float()
        del llm, engine, model, linears
        ref = prompt_logits(LLM(str(path), progress=False, kv_cache_memory=16 * 2**20, max_model_len=256,
                                dtype="float32", quantization="dequantize"), ids)
        rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
        assert float(rel.median()) < 2e-2, float(rel.median())
