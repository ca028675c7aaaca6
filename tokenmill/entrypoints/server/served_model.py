"""ServedModel: one model a server offers, known from its header before anything is loaded; how models
are found and named; Ollama's keep-alive durations.

    tokenmill serve A.gguf B.gguf --models-dir DIR
        A.gguf, B.gguf   named as one model always was: the file stem (`default`: SmolLM2-135M-Instruct),
                         an HF directory by its name; --served-model-name renames a single model
        DIR/*.gguf       named as Ollama names them: the GGUF's general.basename (else general.name) and
                         general.size_label, lowercased, `smollm2:135m`; the file stem when either is missing
        DIR/<dir>/       an HF-style directory (config.json and *.safetensors), by its directory name
    Two models with one name are an error at start that names both paths.

Memory: a ServedModel's `memory_bytes` is what loading it adds to the process, from the memory plan (the
`tokenmill plan` arithmetic over the header): its weights and its whole KV cache. With several models each
model's KV cache is `--kv-cache-memory` when given, else SEVERAL_MODELS_KV_CACHE_BYTES (a fixed share,
so that a model's size does not depend on what else is loaded when it loads).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.config import EngineConfig
from tokenmill.loader.model_config import ModelConfig
from tokenmill.loader.model_source import ModelSource, resolve_model
from tokenmill.memory_plan import RUNTIME_BYTES, CacheTooSmallError, available_ram, default_kv_cache_bytes

if TYPE_CHECKING:
    from tokenmill.engine.llm_engine import LLMEngine

log = logging.getLogger("tokenmill.server")
DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays loaded when several are served (Ollama's 5 minutes)
SEVERAL_MODELS_KV_CACHE_BYTES = 512 * 2**20  # each model's KV cache without --kv-cache-memory, when several
# Go durations ("5m", "1h30m", "300ms"), optionally signed; a bare number is seconds
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(r"-?(?:\d+(?:\.\d*)?(?:ns|us|µs|ms|s|m|h))+|-?\d+(?:\.\d*)?")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: str | float) -> float | None:
    """Ollama's keep_alive in seconds: "5m", "1h30m", "300ms", "300" or 300 -> seconds; 0 -> unload once
    idle; negative -> None (never unload). Raises ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a duration (e.g. \"5m\", \"1h\", 300, -1)")
    if isinstance(value, str):
        text = value.strip()
        if not _DURATION.fullmatch(text):
            raise ValueError(f"{value!r} is not a duration (e.g. \"5m\", \"1h\", 300, -1)")
        sign = -1.0 if text.startswith("-") else 1.0
        parts = _DURATION_PART.findall(text)
        seconds = sign * (sum(float(n) * _UNIT_SECONDS[u] for n, u in parts) if parts else abs(float(text)))
    else:
        seconds = float(value)
    return None if seconds < 0 else seconds


@dataclass(frozen=True)
class ServedModel:
    """A model the server offers: its name, how to load it, and what its header says (no weights read)."""

    name: str  # what clients ask for
    engine_config: EngineConfig  # how to load it
    source: ModelSource
    model_config: ModelConfig
    max_model_len: int
    memory_bytes: int  # weights + the whole KV cache: what loading it adds (the memory plan)
    extra_names: tuple[str, ...] = ()  # further names requests may use (--served-model-name's after the first)

    @property
    def aliases(self) -> frozenset[str]:
        """Every name a request may use for it: its name, the model's own (the file stem), and extra_names."""
        return frozenset({self.name, self.source.name, *self.extra_names})

    @classmethod
    def plan(cls, name: str, engine_config: EngineConfig) -> ServedModel:
        """From the model's header and the memory plan, before loading (the engine's arithmetic: a draft
        model for speculative decoding included). Raises what `tokenmill plan` would (a model that is not
        there, a CacheTooSmallError for settings that cannot work)."""
        from tokenmill.entrypoints.plan import plan_model

        c = engine_config
        source = resolve_model(c.model)
        device = _device(c.device)
        kv_bytes = c.kv_cache_memory or default_kv_cache_bytes(device != "cpu", available_ram())
        cfg, _, plan = plan_model(c.model, device, c.dtype, c.quantization, c.block_size, kv_bytes, c.max_model_len,
                                  c.max_num_batched_tokens, c.speculative_config, c.dense_copy)
        max_len = plan.max_model_len
        try:
            plan.check()
        except CacheTooSmallError:
            for line in plan.lines():  # the arithmetic behind the verdict, as the engine logs it
                log.info("memory plan: %s", line)
            raise
        return cls(name, engine_config, source, cfg, max_len, plan.total_bytes - RUNTIME_BYTES)

    @classmethod
    def of_engine(cls, name: str, engine: LLMEngine) -> ServedModel:
        """A model that is loaded already: the engine's own plan and config (it can be loaded again)."""
        return cls(name, engine.config, engine.source, engine.model_config, engine.max_model_len,
                   engine.plan.total_bytes - RUNTIME_BYTES)


def _device(device: str) -> str:
    """"cpu" or "cuda" for a config's device ("auto": what torch sees)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":")[0]


def ollama_style_name(source: ModelSource) -> str:
    """A models-dir entry's name (the module doc's rule)."""
    if source.kind != "gguf":
        return source.name
    from tokenmill.loader.gguf import GGUFFile

    gf = GGUFFile(source.path)
    try:
        meta = gf.metadata
        base, size = meta.get("general.basename") or meta.get("general.name"), meta.get("general.size_label")
    finally:
        gf.close()
    if not isinstance(base, str) or not isinstance(size, str) or not base.strip() or not size.strip():
        return source.name
    return f"{base.strip()}:{size.strip()}".lower().replace(" ", "-")


def models_in(directory: str | Path) -> list[Path]:
    """Every GGUF file and HF-style directory (config.json and *.safetensors) directly in `directory`."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--models-dir {directory}: not a directory")
    found = [p for p in sorted(root.iterdir())
             if (p.is_file() and p.suffix.lower() == ".gguf")
             or (p.is_dir() and (p / "config.json").is_file() and any(p.glob("*.safetensors")))]
    if not found:
        raise FileNotFoundError(f"--models-dir {directory} holds no .gguf file and no HF-style directory")
    return found


def name_models(models: list[str], models_dir: str | None, served_model_name: str | None) -> list[tuple[str, str]]:
    """(name, model) for every model to serve, in order: the positional models, then the directory's.
    Raises ValueError for two models with one name (naming both) or --served-model-name with several."""
    named = [(resolve_model(m).name, m) for m in models]
    if models_dir is not None:
        named += [(ollama_style_name(resolve_model(str(p))), str(p)) for p in models_in(models_dir)]
    if served_model_name is not None:
        if len(named) != 1:
            raise ValueError("--served-model-name names a single model; with several, each is named from its file "
                             "(README: Several models)")
        named = [(served_model_name, named[0][1])]
    seen: dict[str, str] = {}
    for name, model in named:
        if name in seen:
            raise ValueError(f"two models are both named {name!r}: {seen[name]} and {model}; serve one of them, or "
                             "rename a file")
        seen[name] = model
    return named


def engine_config_for(base: EngineConfig, model: str, num_models: int) -> EngineConfig:
    """`base` (the engine flags) for one of `num_models` models: with several, a fixed KV cache share
    unless --kv-cache-memory was given (the module doc)."""
    kv = base.kv_cache_memory if base.kv_cache_memory or num_models == 1 else SEVERAL_MODELS_KV_CACHE_BYTES
    return dataclasses.replace(base, model=model, kv_cache_memory=kv)
