"""ModelListing and ModelCard: a served model as Ollama's clients see it. A listing (/api/tags) comes from
the model's files and header, loaded or not; a card (/api/show, /api/ps) from its loaded engine, once.

Naming: Ollama's names are `name:tag`, and a name without a tag means `:latest`. A served name (e.g.
`SmolLM2-135M-Instruct`, `smollm2:135m`) is listed as `NAME:latest` unless it has a tag; a request may use
either spelling, or the model's own name (the pool resolves them). Anything else is Ollama's 404.

`digest` identifies the file (sha256 of its path, size and modification time), not its bytes: hashing a
multi-GiB file at every start would cost more than a fingerprint is worth. `model_info` is the GGUF
file's metadata (arrays longer than 64 entries, the tokenizer's vocabulary and merges, left out unless
`verbose`), or for an HF directory the same keys derived from its config.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.entrypoints.ollama.protocol import ModelDetails

if TYPE_CHECKING:
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.loader.model_source import ModelSource

log = logging.getLogger("tokenmill.server")

_MAX_SHORT_ARRAY = 64  # model_info arrays longer than this are null unless verbose (Ollama's own habit)
# fill-in-middle tokens (prefix, suffix, middle) by vocabulary spelling, for models whose GGUF does not name them
_FIM_SPELLINGS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                  ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                  ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), ("▁<PRE>", "▁<SUF>", "▁<MID>"))


def ollama_name(name: str) -> str:
    """`name` with Ollama's default tag: `x` -> `x:latest`; a tagged name stays."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def timestamp(t: float | None = None) -> str:
    """RFC 3339 in UTC with microseconds, as Ollama writes its times: 2026-12-01T10:00:00.123456Z."""
    when = datetime.datetime.fromtimestamp(t, datetime.timezone.utc) if t is not None else \
        datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parameter_size(n: int) -> str:
    """Ollama's short count: 134515008 -> 134.52M, 7615616512 -> 7.6B."""
    if n >= 10**9:
        return f"{n / 1e9:.1f}B"
    if n >= 10**6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.2f}K"


@dataclass(frozen=True)
class ModelListing:
    """What /api/tags says of a model: from its files and header, so a model not loaded is listed too."""

    name: str  # Ollama's spelling, with a tag
    size: int  # bytes on disk
    digest: str
    modified_at: str
    details: ModelDetails
    metadata: dict[str, Any]  # the GGUF's metadata ({} for an HF directory)

    @classmethod
    def of(cls, served_name: str, src: ModelSource, cfg: ModelConfig) -> ModelListing:
        files = [src.path] if src.kind == "gguf" else sorted(Path(src.path).glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        mtime = max((f.stat().st_mtime for f in files), default=0.0)
        digest = hashlib.sha256(f"{Path(src.path).resolve()}|{size}|{mtime}".encode()).hexdigest()
        metadata = _gguf_metadata(src.path) if src.kind == "gguf" else {}
        family = str(metadata.get("general.architecture", cfg.architecture))
        quant = _quantization_level(metadata.get("general.file_type"), cfg.quantization)
        details = ModelDetails(format="gguf" if src.kind == "gguf" else "safetensors", family=family,
                               families=[family], parameter_size=parameter_size(cfg.num_parameters()),
                               quantization_level=quant)
        return cls(ollama_name(served_name), size, digest, timestamp(mtime), details, metadata)


@dataclass(frozen=True)
class ModelCard:
    name: str  # Ollama's spelling, with a tag
    accepted_names: frozenset[str]
    details: ModelDetails
    size: int  # bytes on disk
    memory_bytes: int  # in memory: weights and KV cache (the memory plan)
    is_gpu: bool
    digest: str
    modified_at: str
    context_length: int  # the server's max_model_len
    license: str
    template: str  # the model's chat template (Jinja, as its files carry it)
    fim_token_ids: tuple[int, int, int] | None  # prefix, suffix, middle: the model can fill in the middle
    info: dict[str, Any]  # model_info, verbose

    def accepts(self, requested: str) -> bool:
        return requested in self.accepted_names

    def model_info(self, verbose: bool) -> dict[str, Any]:
        if verbose:
            return dict(self.info)
        return {k: None if isinstance(v, list) and len(v) > _MAX_SHORT_ARRAY else v for k, v in self.info.items()}

    @property
    def capabilities(self) -> list[str]:
        return ["completion", *(["insert"] if self.fim_token_ids else [])]

    @classmethod
    def of(cls, engine: LLMEngine, served_name: str) -> ModelCard:
        cfg = engine.model_config
        listing = ModelListing.of(served_name, engine.source, cfg)
        metadata = listing.metadata
        info = dict(metadata) or _info_from_config(cfg)
        info["general.parameter_count"] = cfg.num_parameters()
        names = {served_name, ollama_name(served_name), engine.model_name, ollama_name(engine.model_name)}
        return cls(name=listing.name, accepted_names=frozenset(names), details=listing.details, size=listing.size,
                   memory_bytes=engine.plan.total_bytes, is_gpu=engine.platform.device.type != "cpu",
                   digest=listing.digest, modified_at=listing.modified_at, context_length=engine.max_model_len,
                   license=str(metadata.get("general.license", "")), template=engine.tokenizer.chat_template or "",
                   fim_token_ids=_fim_tokens(metadata, engine), info=info)


def _quantization_level(file_type: Any, stored: str) -> str:
    """Ollama's spelling: a GGUF's general.file_type (Q4_K_M, F16, ...), else the checkpoint's dtype (BF16)."""
    if isinstance(file_type, int):
        import gguf

        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    if stored.startswith("GGUF "):  # "GGUF Q4_1 (210), F32 (61)": the first (most common) type
        return stored[5:].split()[0].rstrip(",")
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(stored, stored.upper())


def _plain(value: Any) -> Any:
    """A GGUF metadata value as JSON: numpy arrays and scalars become lists and numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _gguf_metadata(path: Path) -> dict[str, Any]:
    from tokenmill.loader.gguf import GGUFFile

    gf = GGUFFile(path)
    try:
        return {k: _plain(v) for k, v in gf.metadata.items()}
    finally:
        gf.close()


def _info_from_config(cfg: Any) -> dict[str, Any]:
    """GGUF's key names for an HF directory's config."""
    a = cfg.architecture
    return {"general.architecture": a, "general.name": cfg.name, f"{a}.context_length": cfg.max_position_embeddings,
            f"{a}.embedding_length": cfg.hidden_size, f"{a}.block_count": cfg.num_layers,
            f"{a}.feed_forward_length": cfg.intermediate_size, f"{a}.attention.head_count": cfg.num_heads,
            f"{a}.attention.head_count_kv": cfg.num_kv_heads, f"{a}.attention.key_length": cfg.head_dim,
            f"{a}.rope.freq_base": cfg.rope_theta, f"{a}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
            f"{a}.vocab_size": cfg.vocab_size}


def _fim_tokens(metadata: dict[str, Any], engine: LLMEngine) -> tuple[int, int, int] | None:
    """The fill-in-middle token ids: llama.cpp's GGUF keys, else a known spelling in the vocabulary."""
    for keys in (("fim_pre", "fim_suf", "fim_mid"), ("prefix", "suffix", "middle")):
        pre, suf, mid = (metadata.get(f"tokenizer.ggml.{k}_token_id") for k in keys)
        if isinstance(pre, int) and isinstance(suf, int) and isinstance(mid, int):
            return pre, suf, mid
    tok = engine.tokenizer
    for spelling in _FIM_SPELLINGS:
        p, s, m = (tok.token_to_id(t) for t in spelling)
        if p is not None and s is not None and m is not None:
            return p, s, m
    return None
