"""LLMEngine: load a model once, then add requests and step. Synchronous; the server wraps it.

One step = schedule -> run the model -> advance requests -> detokenize -> RequestOutputs.
"""

from __future__ import annotations

import logging
import time
from functools import cached_property
from typing import Any

from tokenmill.config import EngineConfig, format_size
from tokenmill.engine.block_manager import BlockManager
from tokenmill.engine.input_processor import ContextLengthError as ContextLengthError  # re-exported: its old home
from tokenmill.engine.input_processor import InputProcessor, ProcessedPrompt
from tokenmill.engine.output_processor import OutputProcessor
from tokenmill.engine.request import Request, RequestStatus
from tokenmill.engine.scheduler import Scheduler, SchedulerConfig
from tokenmill.loader.model_source import ModelSource, resolve_model
from tokenmill.memory_plan import MemoryPlan, make_plan
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams

log = logging.getLogger("tokenmill")


def load_model_and_tokenizer(source: ModelSource, progress: bool = True) -> tuple[Any, Any, Any]:
    """(ModelConfig, Tokenizer, weight iterator factory) for a model source."""
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.tokenizer.tokenizer import Tokenizer

    if source.kind == "gguf":
        from tokenmill.loader.gguf import GGUFFile
        from tokenmill.loader.weights import gguf_weights

        gf = GGUFFile(source.path)
        cfg = ModelConfig.from_gguf(gf.metadata, set(gf.tensors), gf.quantization())
        tok = Tokenizer.from_gguf(gf.metadata)
        return cfg, tok, lambda: gguf_weights(gf, cfg, progress)
    from tokenmill.loader.weights import safetensors_weights

    cfg = ModelConfig.from_hf_dir(source.path)
    tok = Tokenizer.from_hf_dir(source.path)
    return cfg, tok, lambda: safetensors_weights(source.path, progress)


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        import torch

        from tokenmill.models.llama import LlamaModel
        from tokenmill.platforms import resolve_platform
        from tokenmill.worker.model_runner import ModelRunner

        t0 = time.monotonic()
        self.config = config
        self.source = resolve_model(config.model)
        self.platform = resolve_platform(config)
        if config.quantization == "int8" and self.platform.is_cuda:
            raise ValueError("quantization int8 is a CPU mode (torch's int8 weight-only CPU kernel); "
                             "use it with --device cpu")
        self.model_config, self.tokenizer, weights = load_model_and_tokenizer(self.source, progress)
        cfg = self.model_config
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        dtype_bytes = torch.tensor([], dtype=self.platform.dtype).element_size()
        kv_bytes = config.kv_cache_memory or self.platform.default_kv_cache_memory()
        prepack = self.platform.prepack_weights() and config.quantization is None
        self.plan: MemoryPlan = make_plan(cfg, dtype_bytes, config.block_size, kv_bytes, self.max_model_len, prepack)
        for line in self.plan.lines():
            log.info("memory plan: %s", line)
        self.plan.check()  # refuse settings that cannot work, before loading anything big

        model = LlamaModel(cfg, max_positions=max(self.max_model_len, 1))
        model.load_weights(weights())
        model.finish_loading(self.platform.device, self.platform.dtype, config.quantization,
                             prepack_weights=prepack)
        self.model = model
        self.runner = ModelRunner(model, self.platform, self.plan.num_blocks, config.block_size,
                                  self.tokenizer.eog_token_ids, config.seed)
        self.block_manager = BlockManager(self.plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
                            watermark_blocks=max(1, self.plan.num_blocks // 100)),
            self.block_manager)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.requests: dict[str, list[Request]] = {}  # request id -> its sequences (n of them)
        self.group_of: dict[str, str] = {}  # sequence id -> request id, for n > 1
        self.load_time = time.monotonic() - t0
        log.info("loaded %s: %s, %d layers, %.1fM parameters, %s on disk, computing in %s on %s, context %d "
                 "(model max %d), in %.1fs", self.source.name, cfg.architecture, cfg.num_layers,
                 cfg.num_parameters() / 1e6, cfg.quantization, str(self.platform.dtype).replace("torch.", ""),
                 self.platform.device, self.max_model_len, cfg.max_position_embeddings, self.load_time)

    # -- requests --------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.source.name

    @cached_property
    def input_processor(self) -> InputProcessor:
        """The one input path (tokenize, truncate, validate), shared with `LLM` and the server."""
        return InputProcessor(self.tokenizer, self.model_config.vocab_size, self.max_model_len)

    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.input_processor.tokenize_prompt(prompt)

    def validate_prompt(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Check the prompt fits; returns the resolved max_tokens. Raises ParamError / ContextLengthError."""
        return self.input_processor.validate(prompt_ids, params)

    def add_request(self, request_id: str, prompt: str | list[int] | ProcessedPrompt, params: SamplingParams,
                    stream: bool = False, arrival_time: float | None = None) -> None:
        """Queue a prompt: text, token ids, or a ProcessedPrompt the caller made with `input_processor`
        for these params (then it is not processed again)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        processed = self.input_processor.process(prompt, params)
        prompt_ids, max_tokens = processed.prompt_token_ids, processed.max_tokens
        now = arrival_time or time.monotonic()
        seqs: list[Request] = []
        for i in range(params.n):
            seed = params.seed if params.seed is None or i == 0 else hash((params.seed, i)) & 0x7FFF_FFFF_FFFF
            seqs.append(Request(f"{request_id}#{i}" if params.n > 1 else request_id, prompt_ids, params,
                                max_tokens, self.tokenizer.eog_token_ids, seed, seqs[0] if i else None, now))
        self.requests[request_id] = seqs
        if params.n > 1:
            self.group_of.update((r.request_id, request_id) for r in seqs)
        self.output_processor.add(request_id, processed.prompt, prompt_ids, seqs, stream)
        for r in seqs:
            self.scheduler.add(r)

    def abort_request(self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED,
                      error: str | None = None) -> RequestOutput | None:
        """Stop a request now; its blocks go back to the pool. Returns its final output."""
        seqs = self.requests.pop(request_id, None)
        if seqs is None:
            return None
        for r in seqs:
            self.scheduler.finish(r, status)
            self.runner.release(r.request_id)
            self.group_of.pop(r.request_id, None)
        st = self.output_processor.states.pop(request_id)
        st.error = error
        return self.output_processor.make_output(st, force=True)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step --------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        result = self.runner.execute(sched)
        finished = self.scheduler.update(sched, result.sampled)
        touched: dict[str, None] = {}
        for s in sched.scheduled:
            if not s.samples:
                continue
            req = s.request
            group_id = self.group_of.get(req.request_id, req.request_id)
            st = self.output_processor.states.get(group_id)
            if st is None or req.request_id not in result.sampled:
                continue
            seq = next(q for q in st.seqs if q.request is req)
            if self.output_processor.on_token(seq, req.token_ids[-1], result.logprobs.get(req.request_id)):
                if req.is_finished:  # it also hit max_tokens: the stop string is the reason given
                    req.status = RequestStatus.FINISHED_STOPPED
                else:
                    self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
                    finished.append(req)
            touched[group_id] = None
        for req in finished:
            self.runner.release(req.request_id)
        outputs: list[RequestOutput] = []
        for gid in touched:
            st = self.output_processor.states[gid]
            out = self.output_processor.make_output(st)
            if out is None:
                continue
            if out.finished:
                del self.output_processor.states[gid]
                for r in self.requests.pop(gid):
                    self.group_of.pop(r.request_id, None)
            if out.finished or st.stream:
                outputs.append(out)
        return outputs

    # -- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": bm.usage, "num_free_blocks": bm.num_free_blocks, "num_blocks": bm.num_blocks,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": bm.num_queries, "prefix_cache_hits": bm.num_hits,
        }

    def describe(self) -> str:
        return f"{self.source.name} ({self.model_config.quantization}), {format_size(self.plan.weight_bytes)} weights"
