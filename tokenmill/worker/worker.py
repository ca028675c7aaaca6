"""Worker: builds the model (from the registry), loads its weights, allocates the KV cache and the
attention backend, and runs steps through its ModelRunner. Everything it is given is plain data."""

from __future__ import annotations

import torch

from tokenmill.attention.registry import create_attention_backend
from tokenmill.compute import UNQUANTIZED_TYPES
from tokenmill.layers.linear import Linear, LinearMethod, get_linear_method
from tokenmill.loader.gguf import TensorInfo
from tokenmill.loader.weight_loader import load_weights
from tokenmill.loader.weights import KeepQuantized, read_weights
from tokenmill.models.registry import get_model_class
from tokenmill.platforms import torch_dtype
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput
from tokenmill.worker.kv_cache import allocate_kv_cache
from tokenmill.worker.model_runner import ModelRunner
from tokenmill.worker.worker_config import WorkerConfig


def keep_blocks(method: LinearMethod) -> KeepQuantized | None:
    """Which GGUF tensors the method takes as their blocks: under gguf every matrix (2-D tensor, or a 3-D
    stack of experts' matrices), except unquantized ones when it requantizes (those come dense and are
    quantized at load)."""
    if not method.keeps_blocks:
        return None
    requant = getattr(method, "requant_type", None)

    def keep(name: str, info: TensorInfo) -> bool:
        return len(info.shape) in (2, 3) and (requant is None or info.ggml_type.name.lower() not in UNQUANTIZED_TYPES)
    return keep


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        cfg, ec = config.model_config, config.engine_config
        device, dtype = torch.device(config.device), torch_dtype(config.dtype)
        model_cls = get_model_class(cfg.architecture)
        method = get_linear_method(config.linear_method, config.requant_type)
        model = model_cls(cfg, method, max_positions=max(config.max_model_len, 1))
        load_weights(model, read_weights(config.source, cfg, config.progress, keep_blocks(method)))
        model.finish_loading(device, dtype)
        method.calibrate([m for m in model.modules() if isinstance(m, Linear)], dtype)
        self.model = model
        self.num_kv_blocks = config.num_blocks
        kv = allocate_kv_cache(cfg.num_layers, config.num_blocks, ec.block_size, cfg.num_kv_heads, cfg.head_dim,
                               dtype, device)
        backend = create_attention_backend(config.attention_backend, ec.block_size, device, kv,
                                           config.decode_mirror_bytes)
        self.runner = ModelRunner(model, kv, backend, device, ec.block_size, cfg.vocab_size,
                                  config.eog_token_ids, ec.seed)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)
