"""The layering of ../shared/docs/architecture.md, checked from the imports: no module imports from a
layer above its own (siblings on one level may import each other), and the engine core stays torch-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tokenmill"

# top-level module or package of tokenmill -> level (higher may import lower, never the reverse)
LEVELS = {
    "cli": 7,
    "entrypoints": 6, "benchmarks": 6, "metrics": 6,
    "engine": 5,
    "executor": 4, "structured_output": 4,
    "worker": 3,
    "attention": 2, "models": 2, "layers": 2, "sample": 2,
    "loader": 1, "tokenizer": 1, "platforms": 1, "memory_plan": 1, "native": 1,
    "config": 0, "sampling_params": 0, "scheduler_output": 0, "outputs": 0, "version": 0, "cpu_features": 0,
    "compute": 0, "heap": 0, "sampling_defaults": 0,
}
# the package root re-exports the public API (LLM, SamplingParams, ...), lazily: it is the facade, not a layer
FACADE = {"tokenmill/__init__.py"}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tokenmill" else None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every tokenmill import in the file, at any depth (lazy imports count too)."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("tokenmill."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tokenmill":  # the facade: it pulls in the entry points, so it is the top
                found.extend((node.lineno, "tokenmill.cli") for a in node.names)
            elif node.module.startswith("tokenmill."):
                found.append((node.lineno, node.module))
    return found


def test_every_module_has_a_level() -> None:
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert not tops - set(LEVELS), f"give these a level in LEVELS (and architecture.md): {sorted(tops - set(LEVELS))}"


def test_no_module_imports_from_a_layer_above() -> None:
    bad: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in FACADE:
            continue
        own = rel.split("/")[1].removesuffix(".py")
        for line, module in imports_of(path):
            other = part_of(module)
            if other is None or other == own:
                continue
            if other not in LEVELS:
                bad.append(f"{rel}:{line} imports {module}, which has no level")
            elif LEVELS[other] > LEVELS[own]:
                bad.append(f"{rel}:{line} ({own}, level {LEVELS[own]}) imports {module} (level {LEVELS[other]})")
    assert not bad, "imports that point up a layer:\n" + "\n".join(bad)


def test_layers_never_import_the_worker() -> None:
    for path in (PACKAGE / "layers").rglob("*.py"):
        assert not [m for _, m in imports_of(path) if part_of(m) == "worker"], path


@pytest.mark.parametrize("module", ["tokenmill.engine.scheduler", "tokenmill.engine.block_manager",
                                    "tokenmill.engine.request", "tokenmill.scheduler_output"])
def test_engine_core_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, '{module} pulled in torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
