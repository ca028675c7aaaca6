"""A damaged .gguf (an interrupted download or copy) is named as such, before anything loads: empty, a header
cut short, tensors cut short, an unknown tensor type. Not a struct error from deep in the parser."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tokenmill.cli import main
from tokenmill.loader.gguf import GGUFError, GGUFFile


@pytest.mark.parametrize("size, words", [
    (0, "is empty, not a GGUF file"),
    (8, "is truncated or corrupt: its header does not parse within the file's 8 bytes"),
    (1_000_000, "is truncated or corrupt: its header does not parse"),
    (50_000_000, "is truncated: its tensors need"),
])
def test_a_cut_file_says_so(size: int, words: str, default_model_path: str, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(default_model_path, "rb") as f:
        cut.write_bytes(f.read(size))
    with pytest.raises(GGUFError, match=words):
        GGUFFile(cut)


def test_an_unknown_tensor_type_says_so(tmp_path: Path) -> None:
    name = b"w"
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name
    header += struct.pack("<I", 1) + struct.pack("<Q", 32) + struct.pack("<IQ", 250, 0)
    path = tmp_path / "odd.gguf"
    path.write_bytes(header + bytes(64))
    with pytest.raises(GGUFError, match="w: unknown tensor type 250"):
        GGUFFile(path)


def test_plan_names_the_damage(default_model_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.gguf"
    with open(default_model_path, "rb") as f:
        cut.write_bytes(f.read(50_000_000))
    assert main(["plan", str(cut)]) != 0
    captured = capsys.readouterr()
    assert "is truncated: its tensors need" in captured.out + captured.err and "Traceback" not in captured.err
