"""Worker: builds the model (from the registry), loads its weights, allocates the KV cache and the
attention backend, and runs steps through its ModelRunner. Everything it is given is plain data."""

from __future__ import annotations

import torch

from tokenmill.attention.registry import create_attention_backend
from tokenmill.layers.linear import get_linear_method
from tokenmill.loader.weight_loader import load_weights
from tokenmill.loader.weights import read_weights
from tokenmill.models.registry import get_model_class
from tokenmill.platforms import torch_dtype
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput
from tokenmill.worker.kv_cache import allocate_kv_cache
from tokenmill.worker.model_runner import ModelRunner
from tokenmill.worker.worker_config import WorkerConfig


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        cfg, ec = config.model_config, config.engine_config
        device, dtype = torch.device(config.device), torch_dtype(config.dtype)
        model_cls = get_model_class(cfg.architecture)
        model = model_cls(cfg, get_linear_method(config.linear_method), max_positions=max(config.max_model_len, 1))
        load_weights(model, read_weights(config.source, cfg, config.progress))
        model.finish_loading(device, dtype)
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
