"""What a wheel carries: every file the package reads at run time that is not Python (the native kernels'
C++ sources, built with g++ at install or first use; the web UI) is named in pyproject.toml's package-data,
else a `pip install` from a wheel runs without them (the torch fallback, the UI's 404)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_non_python_file_in_the_package_is_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing = []
    for f in sorted((ROOT / "tokenmill").rglob("*")):
        if not f.is_file() or f.suffix in (".py", ".pyc", ".typed") or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(ROOT)
        matched = False
        for package, globs in data.items():
            pkg_dir = Path(*package.split("."))
            if pkg_dir in rel.parents:
                inside = rel.relative_to(pkg_dir).as_posix()
                matched |= any(fnmatch.fnmatch(inside, g) for g in globs)
        if not matched:
            missing.append(str(rel))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
    assert "tokenmill.native" in data  # (the loop checked something)


def test_bench_specs_default_prompts_are_inside_the_package() -> None:
    """`tokenmill bench spec`'s grounded workload is read from the package (a wheel install has no benchmarks/
    folder beside it), and benchmarks/prompts/ still finds the same file for the scripts there."""
    from tokenmill.benchmarks.spec import GROUNDED

    assert GROUNDED.is_file() and (ROOT / "tokenmill") in GROUNDED.parents
    assert (ROOT / "benchmarks" / "prompts" / "spec_grounded.json").read_bytes() == GROUNDED.read_bytes()
