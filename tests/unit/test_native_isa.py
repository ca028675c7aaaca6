"""TOKENMILL_NATIVE_ISA: the native libraries built for an AVX2-only CPU carry no AVX-512 or AMX instruction
(what lets an AVX-512 host measure the code a Zen 3 runs), and a value it does not know is refused."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tokenmill.cpu_features import cpu_flags
from tokenmill.native import block_matmul
from tokenmill.native.compile import ISA_ENV, NativeBuildError, build_library, target_isa

needs_tools = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("objdump") is None,
                                 reason="needs g++ and objdump")


def wide_instructions(lib: Path) -> int:
    """How many instructions name a 512-bit register, a mask register or a tile."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    return len(re.findall(r"%zmm|%k[1-7]\b|%tmm|tileload|tdpbf16", text))


@needs_tools
def test_avx2_target_leaves_out_avx512_and_amx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(ISA_ENV, "avx2")
    avx2 = build_library("tokenmill_block_matmul", block_matmul.SOURCES, block_matmul.FLAGS)
    assert wide_instructions(avx2) == 0
    text = subprocess.run(["objdump", "-d", str(avx2)], capture_output=True, text=True, check=True).stdout
    assert "%ymm" in text  # the AVX2 loops, not the plain C++ ones
    if "avx512bw" in cpu_flags():  # the same sources for this CPU (the build the tests use): its 512-bit code
        monkeypatch.delenv(ISA_ENV)
        monkeypatch.delenv("TOKENMILL_CACHE_DIR")
        native = build_library("tokenmill_block_matmul", block_matmul.SOURCES, block_matmul.FLAGS)
        assert native != avx2 and wide_instructions(native) > 0


def test_an_unknown_isa_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISA_ENV, "avx512")
    with pytest.raises(NativeBuildError, match="TOKENMILL_NATIVE_ISA is one of native, avx2, not 'avx512'"):
        target_isa()
    monkeypatch.delenv(ISA_ENV)
    assert target_isa() == "native"
