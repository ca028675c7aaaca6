"""Weight readers: yield (HF parameter name, tensor) pairs; the model decides what to do with them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from tokenmill.loader.gguf import GGUFFile
from tokenmill.loader.model_config import ModelConfig

_GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of q/k (its rotary pairs adjacent dims; HF pairs halves)."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_weights(gf: GGUFFile, cfg: ModelConfig, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    permuted = gf.architecture == "llama"  # llama.cpp's converter permutes q/k only for the llama arch
    for name in tqdm(list(gf.tensors), desc="Loading weights", unit="tensor", disable=not progress, leave=False):
        w = gf.load(name)
        if name == "token_embd.weight":
            yield "model.embed_tokens.weight", torch.from_numpy(w)
        elif name == "output_norm.weight":
            yield "model.norm.weight", torch.from_numpy(w)
        elif name == "output.weight":
            yield "lm_head.weight", torch.from_numpy(w)
        elif name == "rope_freqs.weight":
            yield "rope_freqs", torch.from_numpy(w)
        elif m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name):
            layer, part, kind = m.groups()
            if part not in _GGUF_TO_HF:
                raise ValueError(f"unexpected GGUF tensor {name}")
            if permuted and part == "attn_q":
                w = _unpermute(w, cfg.num_heads)
            elif permuted and part == "attn_k":
                w = _unpermute(w, cfg.num_kv_heads)
            yield f"model.layers.{layer}.{_GGUF_TO_HF[part]}.{kind}", torch.from_numpy(np.ascontiguousarray(w))
        else:
            raise ValueError(f"unexpected GGUF tensor {name}")


def safetensors_weights(path: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    for file in tqdm(files, desc="Loading weights", unit="file", disable=not progress, leave=False):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
