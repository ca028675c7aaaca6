"""Worker: builds the model (from the registry), loads its weights, allocates the KV cache and the
attention backend (and, for speculative decoding, a model drafter), and runs steps through its
ModelRunner. Everything it is given is plain data."""

from __future__ import annotations

import logging

import torch

from tokenmill.attention.registry import create_attention_backend
from tokenmill.compute import UNQUANTIZED_TYPES, held_type
from tokenmill.layers.linear import Linear, LinearMethod, get_linear_method
from tokenmill.loader.gguf import TensorInfo
from tokenmill.loader.model_config import ModelConfig
from tokenmill.loader.model_source import ModelSource
from tokenmill.loader.weight_loader import load_weights
from tokenmill.loader.weights import KeepQuantized, read_weights
from tokenmill.models.interface import CausalLM
from tokenmill.models.registry import get_model_class
from tokenmill.platforms import torch_dtype
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput
from tokenmill.worker.drafter import ModelDrafter
from tokenmill.worker.kv_cache import allocate_kv_cache, per_layer_views
from tokenmill.worker.model_runner import ModelRunner
from tokenmill.worker.recurrent_state import RecurrentStatePool
from tokenmill.worker.worker_config import DraftConfig, WorkerConfig

log = logging.getLogger(__name__)


def keep_blocks(method: LinearMethod) -> KeepQuantized | None:
    """Which GGUF tensors the method takes as their blocks: under gguf every matrix (2-D tensor, or a 3-D
    stack of experts' matrices; not a 2-D stack of experts' biases), except, when it requantizes, those of
    another type than the one asked for (compute.held_type): they come dense and are quantized at load. Requantizing a matrix the file already
    quantized is logged once, with the types, as llama-quantize warns of it."""
    if not method.keeps_blocks:
        return None
    requant = getattr(method, "requant_type", None)
    warned: set[str] = set()

    def keep(name: str, info: TensorInfo) -> bool:
        if (len(info.shape) not in (2, 3) or name.endswith(".bias") or ".conv1d." in name
                or ".conv.conv." in name  # LFM2's short conv (C, K)
                or not name.endswith(".weight") or name.endswith("norm.weight")):
            # (a stack of experts' biases is 2-D; a causal conv's (channels, kernel) weight is no matmul's, nor
            # Granite 4.0-H's ssm_a / ssm_d (H, 1) and ssm_norm (groups, d_inner / groups))
            return False
        stored = info.ggml_type.name.lower()
        held = held_type(stored, requant, info.shape[-1])
        if held != stored and stored not in UNQUANTIZED_TYPES and stored not in warned:
            warned.add(stored)
            log.warning("requantizing the file's %s matrices to %s at load: their error is at least the larger "
                        "of the two types' (drop --quantization to run the file's own blocks)", stored, held)
        return held == stored
    return keep


def load_model(source: ModelSource, cfg: ModelConfig, linear_method: str, requant_type: str | None,
               max_positions: int, device: torch.device, dtype: torch.dtype, progress: bool,
               dense_copy: bool = False, vnni_pack: bool = False) -> CausalLM:
    """Build the registry's model class for cfg, load its weights from source, finish it on device."""
    method = get_linear_method(linear_method, requant_type, dtype if dense_copy else None, vnni_pack)
    model = get_model_class(cfg.architecture)(cfg, method, max_positions=max(max_positions, 1))
    load_weights(model, read_weights(source, cfg, progress, keep_blocks(method)))
    model.finish_loading(device, dtype)
    method.calibrate([m for m in model.modules() if isinstance(m, Linear)], dtype)
    return model  # type: ignore[no-any-return]


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        cfg, ec = config.model_config, config.engine_config
        device, dtype = torch.device(config.device), torch_dtype(config.dtype)
        model = load_model(config.source, cfg, config.linear_method, config.requant_type, config.max_model_len,
                           device, dtype, config.progress, config.dense_copy, config.vnni_pack)
        self.model = model
        self.num_kv_blocks = config.num_blocks
        kv = allocate_kv_cache(len(cfg.kv_layers), config.num_blocks, ec.block_size, cfg.num_kv_heads, cfg.head_dim,
                               dtype, device)
        backend = create_attention_backend(config.attention_backend, ec.block_size, device, kv,
                                           config.decode_mirror_bytes)
        states = RecurrentStatePool(cfg, config.num_state_slots, device) if cfg.linear_layers else None
        self.runner = ModelRunner(model, kv, backend, device, ec.block_size, cfg.vocab_size,
                                  config.eog_token_ids, ec.seed, states)
        if config.draft is not None:
            self.runner.drafter = self._drafter(config, config.draft, model, kv, device, dtype)

    @staticmethod
    def _drafter(config: WorkerConfig, draft: DraftConfig, target: CausalLM, target_kv: torch.Tensor,
                 device: torch.device, dtype: torch.dtype) -> ModelDrafter:
        """layer_skip: the target over its own cache; draft_model: the draft with a cache of its own in the
        same block layout. The drafter's attention backend is its own instance (a decode mirror would keep
        a second copy of the K/V: the paged backend instead)."""
        bs = config.engine_config.block_size
        name = "paged" if config.attention_backend == "decode_mirror" else config.attention_backend
        vocab = config.model_config.vocab_size
        if draft.source is None:
            return ModelDrafter(target, per_layer_views(target_kv), create_attention_backend(name, bs, device, target_kv),
                                device, vocab, bs, num_layers=draft.num_layers, own_cache=False)
        dcfg = draft.model_config
        assert dcfg is not None
        model = load_model(draft.source, dcfg, draft.linear_method, draft.requant_type, config.max_model_len,
                           device, dtype, config.progress)
        kv = allocate_kv_cache(dcfg.num_layers, config.num_blocks, bs, dcfg.num_kv_heads, dcfg.head_dim, dtype, device)
        return ModelDrafter(model, per_layer_views(kv), create_attention_backend(name, bs, device, kv), device, vocab,
                            bs, num_layers=None, own_cache=True)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)
