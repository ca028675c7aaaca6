"""`tokenmill plan`: arithmetic from the header alone, with a verdict that names the setting to change."""

from __future__ import annotations

import subprocess
import sys

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


def test_plan_imports_no_torch() -> None:
    code = ("import sys; from tokenmill.entrypoints.plan import read_model_config; read_model_config('default'); "
            "assert 'torch' not in sys.modules, 'plan must not import torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_auto_dtype_follows_the_cpu(capsys, monkeypatch) -> None:
    """--dtype auto: bf16 where the CPU has AMX (half the KV bytes), fp32 elsewhere; serve decides alike."""
    import tokenmill.cpu_features as cf

    for flags, per_token in ((frozenset({"avx2"}), "45.0 KiB"), (frozenset({"avx2", "amx_tile", "amx_bf16"}), "22.5 KiB")):
        monkeypatch.setattr(cf, "cpu_flags", lambda f=flags: f)
        assert main(["plan", "--kv-cache-memory", "1GiB", "--max-model-len", "4096"]) == 0
        out = capsys.readouterr().out
        assert f"{per_token} per token" in out
        # bf16 on AMX prepacks the weights: SmolLM2's tied 49152 x 576 output layer gets a second copy
        assert ("+ 54.0 MiB (prepacked copy of the tied output layer)" in out) == (per_token == "22.5 KiB")
