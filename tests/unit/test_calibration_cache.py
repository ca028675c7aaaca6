"""The crossover measurements' store (layers/calibration_cache.py): kept in the process, shared through a
file when TOKENMILL_CALIBRATION_CACHE names one, and a measurement is reused only for an equal key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenmill.layers.calibration_cache import CACHE_ENV, CalibrationCache, Crossover


def test_kept_in_the_process_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    cache = CalibrationCache()
    assert cache.get("k") is None
    cache.put("k", Crossover(16, 8, False, ["M=4 1/2/3 ms"]))
    found = cache.get("k")
    assert found is not None and found[0] == Crossover(16, 8, False, ["M=4 1/2/3 ms"])
    assert "this process" in found[1]
    assert cache.get("other") is None


def test_shared_through_the_file_and_a_bad_file_is_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "calibration.json"
    monkeypatch.setenv(CACHE_ENV, str(path))
    CalibrationCache().put("a", Crossover(32, None, True))
    CalibrationCache().put("b", Crossover(1 << 40, 16, False))  # another process adds its own: both kept
    fresh = CalibrationCache()
    a, b = fresh.get("a"), fresh.get("b")
    assert a is not None and a[0] == Crossover(32, None, True, []) and str(path) in a[1]
    assert b is not None and b[0].max_ggml_rows == 1 << 40 and b[0].panel_min_rows == 16
    assert not list(path.parent.glob("*.tmp"))  # written by rename, nothing left behind
    path.write_text("{not json")
    assert CalibrationCache().get("a") is None
    path.write_text('{"a": {"unknown_field": 1}}')  # written by another version
    assert CalibrationCache().get("a") is None
