"""`tokenmill plan`: arithmetic from the header alone, with a verdict that names the setting to change."""

from __future__ import annotations

import subprocess
import sys

from tokenmill.entrypoints.cli import main


def test_plan_default_model_works(capsys) -> None:
    assert main(["plan", "--kv-cache-memory", "1GiB", "--max-model-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "45.0 KiB per token" in out  # 2 * 30 layers * 3 kv heads * 64 dims * 4 bytes
    assert "1456 blocks = 23296 tokens" in out
    assert "sequences of 4096 tokens that fit at once: 5" in out
    assert "verdict: works" in out


def test_plan_refuses_with_the_setting_to_change(capsys) -> None:
    assert main(["plan", "--kv-cache-memory", "100MiB"]) == 1
    out = capsys.readouterr().out
    assert "verdict: cannot work" in out
    assert "--kv-cache-memory to at least" in out and "--max-model-len to at most 2272" in out


def test_plan_imports_no_torch() -> None:
    code = ("import sys; from tokenmill.entrypoints.plan import read_model_config; read_model_config('default'); "
            "assert 'torch' not in sys.modules, 'plan must not import torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
