"""`tokenmill plan`: arithmetic from the header alone, with a verdict that names the setting to change."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenmill.cli import main


def test_plan_default_model_works(capsys) -> None:
    assert main(["plan", "--kv-cache-memory", "1GiB", "--max-model-len", "4096", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "45.0 KiB per token" in out  # 2 * 30 layers * 3 kv heads * 64 dims * 4 bytes
    assert "1456 blocks = 23296 tokens" in out
    assert "sequences of 4096 tokens that fit at once: 5" in out
    assert "verdict: works" in out


def test_plan_refuses_with_the_setting_to_change(capsys) -> None:
    assert main(["plan", "--kv-cache-memory", "100MiB", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "verdict: cannot work" in out
    assert "--kv-cache-memory to at least" in out and "--max-model-len to at most 2272" in out


@pytest.mark.parametrize("flags, words", [
    (["--block-size", "0"], "block_size must be a power of two, got 0"),
    (["--block-size", "7"], "block_size must be a power of two, got 7"),
    (["--max-num-seqs", "0"], "max_num_seqs must be at least 1, got 0"),
    (["--max-model-len", "0"], "max_model_len must be at least 1, got 0"),
    (["--seq-len", "-1"], "seq_len must be at least 1, got -1"),
])
def test_plan_refuses_what_serve_refuses(flags: list[str], words: str, capsys) -> None:
    """The settings serve refuses are refused by plan in the same words (it once said "works", or divided by 0)."""
    assert main(["plan", *flags]) == 2
    assert capsys.readouterr().err.strip() == f"tokenmill plan: {words}"


def test_a_cache_without_one_block_names_only_the_cache(capsys) -> None:
    assert main(["plan", "--kv-cache-memory", "1000", "--dtype", "float32"]) == 1
    verdict = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict"))
    assert "Raise --kv-cache-memory to at least" in verdict and "(it holds not one block)" in verdict
    assert "--max-model-len" not in verdict


def test_plan_counts_a_draft_model(capsys) -> None:
    """A draft_model's weights and its K/V per token join the plan: the same budget holds half the blocks
    when the draft is the model itself."""
    from tokenmill.loader.model_source import default_model_path

    spec = '{"method": "draft_model", "model": "%s"}' % default_model_path()
    assert main(["plan", "--kv-cache-memory", "1GiB", "--max-model-len", "4096", "--dtype", "float32",
                 "--speculative-config", spec]) == 0
    out = capsys.readouterr().out
    assert "draft model (speculative decoding): 92.1 MiB weights, 45.0 KiB" in out
    assert "90.0 KiB per token" in out and "728 blocks = 11648 tokens" in out
    assert "sequences of 4096 tokens that fit at once: 2" in out


def test_plan_imports_no_torch() -> None:
    code = ("import sys; from tokenmill.entrypoints.plan import read_model_config; read_model_config('default'); "
            "assert 'torch' not in sys.modules, 'plan must not import torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_auto_dtype_follows_the_cpu(capsys, monkeypatch) -> None:
    """--dtype auto: bf16 where the CPU multiplies bf16 natively, AMX or AVX512_BF16 (half the KV bytes), fp32
    elsewhere (AVX2 only; AVX-512 without its bf16 instructions); serve decides alike."""
    import tokenmill.cpu_features as cf

    for flags, per_token in ((frozenset({"avx2"}), "45.0 KiB"), (frozenset({"avx2", "avx512f"}), "45.0 KiB"),
                             (frozenset({"avx2", "amx_tile", "amx_bf16"}), "22.5 KiB"),
                             (frozenset({"avx2", "avx512f", "avx512_bf16"}), "22.5 KiB")):
        monkeypatch.setattr(cf, "cpu_flags", lambda f=flags: f)
        monkeypatch.setenv("TOKENMILL_VNNI_MATMUL", "1")
        args = ["plan", "--kv-cache-memory", "1GiB", "--max-model-len", "4096", "--quantization", "dequantize"]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert f"{per_token} per token" in out
        dtype, why = ("bfloat16", "AVX512_BF16" if "avx512_bf16" in flags else "AMX") if per_token == "22.5 KiB" \
            else ("float32", "no AMX or AVX512_BF16")
        assert f"compute: {dtype} on cpu (--dtype auto: " in out and why in out, out
        # bf16 on AMX prepacks the weights: SmolLM2's tied 49152 x 576 output layer gets a second copy
        assert ("+ 54.0 MiB (prepacked copy of the tied output layer)" in out) == (per_token == "22.5 KiB")


def test_plan_counts_the_gguf_blocks_a_gguf_file_keeps(capsys, default_model_path) -> None:
    """By default a GGUF file on CPU keeps its blocks: the plan counts the file's matrix bytes (plus norms
    at the compute dtype), not a dequantized copy."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    gf = GGUFFile(default_model_path)
    matrix_bytes = sum(t.num_bytes for t in gf.tensors.values() if len(t.shape) == 2)
    norms = sum(t.shape[0] for t in gf.tensors.values() if len(t.shape) == 1)
    assert main(["plan", "--kv-cache-memory", "1GiB", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    from tokenmill.config import format_size
    assert f"{format_size(matrix_bytes + 4 * norms)} as ggml blocks" in out, out


def test_plan_counts_the_dense_copy(capsys, monkeypatch) -> None:
    """--dense-copy: the gguf method's dense copy of every matmul weight and of the tied output layer, at
    the compute dtype, is in the plan. auto keeps it only at bf16 on a CPU with native bf16 (AMX or
    AVX512_BF16), only where it takes at most 1/8 of the RAM, and not where the 8-bit VNNI panel kernel,
    asked for, takes every matrix (this Q4_1 / Q8_0 file on a CPU with AVX512-VNNI and no AMX); on asks for
    one there too."""
    import tokenmill.cpu_features as cf
    import tokenmill.entrypoints.plan as plan_mod
    from tokenmill.native import ggml

    if not ggml.available():
        pytest.skip(f"ggml not built here: {ggml.unavailable_reason()}")
    amx, avx2 = frozenset({"avx2", "amx_tile", "amx_bf16"}), frozenset({"avx2"})
    zen4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
    zen4_vnni = zen4 | {"avx512bw", "avx512_vnni"}
    spr = amx | zen4_vnni  # AMX with VNNI: the AMX kernel takes bf16 batches, the copy stays
    copy16, copy32 = "+ 256.5 MiB (a dense copy at 16-bit", "+ 513.0 MiB (a dense copy at 32-bit"  # 134.5M values
    monkeypatch.setattr(plan_mod, "total_ram", lambda: 24 * 2**30)
    for flags, setting, ram, want in ((amx, "auto", 24 * 2**30, copy16), (avx2, "auto", 24 * 2**30, None),
                                      (amx, "off", 24 * 2**30, None), (amx, "auto", 1 * 2**30, None),
                                      (avx2, "on", 1 * 2**30, copy32), (zen4, "auto", 24 * 2**30, copy16),
                                      (zen4_vnni, "auto", 24 * 2**30, None), (zen4_vnni, "on", 24 * 2**30, copy16),
                                      (spr, "auto", 24 * 2**30, copy16)):
        # (the VNNI panel asked for: TOKENMILL_VNNI_MATMUL=1; without it the Zen 4 rule above keeps the copy)
        monkeypatch.setattr(cf, "cpu_flags", lambda f=flags: f)
        monkeypatch.setenv("TOKENMILL_VNNI_MATMUL", "1")
        monkeypatch.setattr(plan_mod, "total_ram", lambda r=ram: r)
        assert main(["plan", "--kv-cache-memory", "1GiB", "--dense-copy", setting]) == 0
        out = capsys.readouterr().out
        assert (want in out) if want else ("dense copy" not in out), (flags, setting, ram, out)


def test_the_int8_panel_covers_a_file_only_when_it_takes_every_matrix() -> None:
    from tokenmill.compute import ComputeChoice, Matrix, choose_dense_copy, int8_panel_covers

    q41 = [Matrix(576, 576, "q4_1"), Matrix(49152, 576, "q8_0"), Matrix(576, 576, "q4_0")]
    assert int8_panel_covers(q41, True)
    assert not int8_panel_covers(q41, False)  # no VNNI kernel here (or AMX, or fp32 compute)
    assert not int8_panel_covers(q41 + [Matrix(4096, 4096, "q4_k")], True)  # a K-quant: the copy may still pay
    assert not int8_panel_covers(None, True) and not int8_panel_covers([], True)  # an HF checkpoint
    compute = ComputeChoice(dtype="bfloat16", linear_method="gguf")
    assert choose_dense_copy("auto", compute, 2**28, 24 * 2**30, True).dense_copy
    assert not choose_dense_copy("auto", compute, 2**28, 24 * 2**30, True, int8_panel=True).dense_copy
    assert choose_dense_copy("on", compute, 2**28, 24 * 2**30, True, int8_panel=True).dense_copy
