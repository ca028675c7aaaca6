"""LLMEngine: load a model once, then add requests and step. Synchronous; the server wraps it.

One step = schedule (a plain-data SchedulerOutput) -> the grammar bitmask of the constrained requests that
sample -> the executor runs it on the workers -> the scheduler advances requests -> grammars consume the
new tokens -> detokenize and decide stops (StopChecker) -> RequestOutputs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from tokenmill.compute import TOKEN_BUDGET, Matrix, default_token_budget
from tokenmill.config import EngineConfig, format_size
from tokenmill.engine.block_manager import BlockManager
from tokenmill.engine.input_processor import ContextLengthError as ContextLengthError  # re-exported: its old home
from tokenmill.engine.input_processor import InputProcessor, ProcessedPrompt
from tokenmill.engine.output_processor import OutputProcessor
from tokenmill.engine.request import Request, RequestStatus
from tokenmill.engine.scheduler import Scheduler, SchedulerConfig
from tokenmill.engine.spec_decode import SpecDecoder
from tokenmill.engine.state_cache import StateCache
from tokenmill.engine.stop_checker import StopChecker
from tokenmill.loader.model_source import ModelSource, resolve_model
from tokenmill.memory_plan import MemoryPlan, dense_copy_bytes, make_plan
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_defaults import resolve as resolve_sampling_defaults
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler_output import SchedulerOutput
from tokenmill.structured_output import StructuredOutputManager
from tokenmill.tokenizer.chat_template import load_chat_template

if TYPE_CHECKING:
    from tokenmill.worker.worker_config import DraftConfig

log = logging.getLogger("tokenmill")


def read_model_header(source: ModelSource) -> tuple[Any, Any, list[Matrix] | None, dict[str, Any]]:
    """(ModelConfig, Tokenizer, the GGUF file's matrices or None, its general.sampling.* keys) of a model
    source, from its header and tokenizer files (no weights)."""
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.tokenizer.tokenizer import Tokenizer

    if source.kind == "gguf":
        from tokenmill.loader.gguf import GGUFFile

        gf = GGUFFile(source.path)
        try:
            sampling = {k: v for k, v in gf.metadata.items() if k.startswith("general.sampling.")}
            return (ModelConfig.from_gguf(gf.metadata, set(gf.tensors), gf.quantization()),
                    Tokenizer.from_gguf(gf.metadata), gf.matrices(), sampling)
        finally:
            gf.close()
    return ModelConfig.from_hf_dir(source.path), Tokenizer.from_hf_dir(source.path), None, {}


def vocabulary_mismatch(target: dict[str, int], draft: dict[str, int]) -> str | None:
    """Why a draft's vocabulary (token -> id) cannot stand for the target's, or None when they are the same."""
    if target == draft:
        return None
    if len(target) != len(draft):
        return f"its vocabulary has {len(draft)} tokens, the target's {len(target)}"
    by_id = {i: t for t, i in draft.items()}
    for tok, i in sorted(target.items(), key=lambda kv: kv[1]):
        if by_id.get(i) != tok:
            return f"token {i} is {tok!r} in the target and {by_id.get(i)!r} in the draft"
    return "the vocabularies differ"


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        from tokenmill.executor.in_process import InProcessExecutor
        from tokenmill.models.registry import get_model_class
        from tokenmill.platforms import resolve_platform
        from tokenmill.worker.worker_config import WorkerConfig

        t0 = time.monotonic()
        self.config = config
        self.source = resolve_model(config.model)
        # device, dtype and linear method: decided once, here
        self.platform = resolve_platform(config, weights=self.source.kind)
        self.model_config, self.tokenizer, matrices, gguf_sampling = read_model_header(self.source)
        # what a request that leaves a sampling field out gets (--generation-config; vLLM's rule)
        self.sampling_defaults = resolve_sampling_defaults(config.generation_config, self.source.kind,
                                                           self.source.path, gguf_sampling,
                                                           config.override_generation_config)
        if self.sampling_defaults.describe():
            log.info("%s", self.sampling_defaults.describe())
        if config.chat_template is not None:
            self.tokenizer.chat_template = load_chat_template(config.chat_template)
        cfg = self.model_config
        self.platform = self.platform.with_dense_copy(config.dense_copy,
                                                      dense_copy_bytes(cfg, self.platform.compute.dtype_bytes),
                                                      matrices)
        get_model_class(cfg.architecture)  # an unsupported architecture fails now, before the plan
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        if self.max_model_len > cfg.max_position_embeddings:  # llama.cpp warns as well; vLLM refuses
            log.warning("max_model_len %d is longer than the %d positions %s was trained on: past them its output "
                        "may degrade (unless its rope scaling is meant to reach them)", self.max_model_len,
                        cfg.max_position_embeddings, self.source.name)
        if config.gpu_memory_utilization is not None and not self.platform.is_cuda:
            raise ValueError("--gpu-memory-utilization sizes a GPU's memory; on CPU the KV cache is "
                             "--kv-cache-memory (default: a quarter of available RAM, at most 2 GiB)")
        kv_bytes = config.kv_cache_memory or self.platform.default_kv_cache_memory()
        if config.gpu_memory_utilization is not None and config.kv_cache_memory is None:
            probe = make_plan(cfg, self.platform.compute, config.block_size, kv_bytes, 1, matrices)
            kv_bytes = self.platform.kv_cache_memory_for_share(config.gpu_memory_utilization,
                                                               probe.weight_bytes + probe.extra_weight_bytes)
        # tokens a step may schedule: the flag, else the platform's default (compute.default_token_budget)
        self.max_num_batched_tokens = (config.max_num_batched_tokens or
                                       default_token_budget(self.platform.device.type, self.platform.compute))
        self.plan: MemoryPlan = make_plan(cfg, self.platform.compute, config.block_size, kv_bytes, self.max_model_len,
                                         matrices, max_chunk_tokens=self.max_num_batched_tokens,
                                         max_num_seqs=config.max_num_seqs,
                                         state_checkpoints=config.state_checkpoints if config.enable_prefix_caching else 0)
        if cfg.linear_layers:
            self._check_recurrent(config)
        draft = self._draft_config(config, kv_bytes)
        for line in self.plan.lines():
            log.info("memory plan: %s", line)
        self.plan.check()  # refuse settings that cannot work, before loading anything big

        compute = self.platform.compute
        backend, mirror_bytes = self.platform.attention_backend()
        self.executor = InProcessExecutor(WorkerConfig(
            engine_config=config, source=self.source, model_config=cfg, device=str(self.platform.device),
            dtype=compute.dtype, linear_method=compute.linear_method, requant_type=compute.requant_type,
            dense_copy=compute.dense_copy, vnni_pack=compute.vnni_pack, attention_backend=backend,
            decode_mirror_bytes=mirror_bytes, num_blocks=self.plan.num_blocks,
            max_model_len=self.max_model_len, eog_token_ids=frozenset(self.tokenizer.eog_token_ids),
            progress=progress, draft=draft,
            num_state_slots=self.plan.num_state_slots + self.plan.num_state_checkpoints))
        num_blocks = self.executor.num_kv_blocks()
        # a recurrent state cannot be rebuilt from cached blocks: such a model reuses a prefix only as far as a
        # checkpoint of its state reaches (engine/state_cache.py), and has none without checkpoints
        self.prefix_caching = config.enable_prefix_caching and (not cfg.linear_layers or
                                                                self.plan.num_state_checkpoints > 0)
        self.block_manager = BlockManager(num_blocks, config.block_size, self.prefix_caching)
        self.max_num_seqs = min(config.max_num_seqs, self.plan.num_state_slots or config.max_num_seqs)
        self.state_cache = (StateCache(self.plan.num_state_slots, self.plan.num_state_checkpoints, config.block_size)
                            if cfg.linear_layers else None)
        self.scheduler = Scheduler(
            SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len,
                            watermark_blocks=max(1, num_blocks // 100), sliding_window=cfg.uniform_window),
            self.block_manager, self.state_cache)
        # the one input path (render, tokenize, truncate, validate), shared with `LLM` and the server
        self.input_processor = InputProcessor(self.tokenizer, cfg.vocab_size, self.max_model_len)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stop_checker = StopChecker(self.max_model_len)
        self.structured = StructuredOutputManager(self.tokenizer, cfg.vocab_size)
        self.spec = SpecDecoder(config.speculative_config, self.max_model_len) if config.speculative_config else None
        self.requests: dict[str, list[Request]] = {}  # request id -> its sequences (n of them)
        self.group_of: dict[str, str] = {}  # sequence id -> request id, for n > 1
        self.load_time = time.monotonic() - t0
        experts = (f" ({cfg.num_parameters(active=True) / 1e6:.1f}M active per token: {cfg.num_experts_per_tok} of "
                   f"{cfg.num_experts} experts)") if cfg.num_experts else ""
        log.info("loaded %s: %s, %d layers, %.1fM parameters%s, %s on disk, computing in %s (%s matmuls) on %s, "
                 "context %d (model max %d), in %.1fs", self.source.name, cfg.architecture, cfg.num_layers,
                 cfg.num_parameters() / 1e6, experts, cfg.quantization, compute.dtype, compute.linear_method,
                 self.platform.device, self.max_model_len, cfg.max_position_embeddings, self.load_time)
        why = "for bf16 on AMX" if self.max_num_batched_tokens > TOKEN_BUDGET else "by default"
        log.info("scheduler: up to %d tokens and %d sequences a step%s", self.max_num_batched_tokens,
                 self.max_num_seqs, "" if config.max_num_batched_tokens else
                 f" (the token budget {why}; --max-num-batched-tokens sets it)")

    def _check_recurrent(self, config: EngineConfig) -> None:
        """What a model with recurrent (linear-attention) layers cannot do here, refused or said now."""
        if config.speculative_config is not None:
            raise ValueError(f"speculative decoding is not supported for {self.source.name}: its recurrent layers "
                             "(linear attention, short convolutions) keep a recurrent state that rejected drafts would have to roll back")
        if config.enable_prefix_caching and not self.plan.num_state_checkpoints:
            log.warning("prefix caching is off for %s: its recurrent layers' state cannot be rebuilt from cached "
                        "blocks, and the KV cache's budget holds no checkpoint of it (--state-checkpoints %s)",
                        self.source.name, config.state_checkpoints)
        elif config.state_checkpoints is not None and self.plan.num_state_checkpoints < config.state_checkpoints:
            log.warning("--state-checkpoints %d: the KV cache's budget holds %d beside the running sequences' states",
                        config.state_checkpoints, self.plan.num_state_checkpoints)
        if self.plan.num_state_slots < config.max_num_seqs:
            log.warning("recurrent state: %s per sequence; the KV cache's budget holds %d at once, so at most %d "
                        "sequences run at once (max_num_seqs %d; raise --kv-cache-memory for more)",
                        format_size(self.plan.state_bytes_per_seq), self.plan.num_state_slots,
                        self.plan.num_state_slots, config.max_num_seqs)

    def _draft_config(self, config: EngineConfig, kv_bytes: int) -> DraftConfig | None:
        """The workers' drafter for a model-based speculative method, checked now: layer_skip's layer count
        against the target's; draft_model's vocabulary against the target's (refused with the first
        difference), its weights and cache added to the memory plan."""
        from tokenmill.models.registry import get_model_class
        from tokenmill.platforms import resolve_platform
        from tokenmill.worker.worker_config import DraftConfig

        spec, cfg = config.speculative_config, self.model_config
        if spec is None or not spec.uses_model:
            return None
        if spec.method == "layer_skip":
            n = spec.num_draft_layers or max(1, cfg.num_layers // 4)
            if n >= cfg.num_layers:
                raise ValueError(f"layer_skip: num_draft_layers must be below the model's {cfg.num_layers} layers, "
                                 f"got {n}")
            return DraftConfig(num_layers=n)
        assert spec.model is not None
        source = resolve_model(spec.model)
        dcfg, dtok, matrices, _ = read_model_header(source)
        get_model_class(dcfg.architecture)
        mismatch = vocabulary_mismatch(self.tokenizer.backend.get_vocab(), dtok.backend.get_vocab())
        if mismatch:
            raise ValueError(f"the draft model {source.name} cannot draft for {self.source.name}: {mismatch}; "
                             "speculative decoding needs the same tokenizer")
        if cfg.uniform_window:
            raise ValueError(f"draft_model: {self.source.name} has a sliding window on every layer (blocks before "
                             "it are freed, and the draft would read them); use ngram or layer_skip")
        dconfig = config if spec.quantization is None else dataclasses.replace(
            config, quantization=None if spec.quantization == "auto" else spec.quantization)
        compute = resolve_platform(dconfig, weights=source.kind).compute
        if compute.dtype != self.platform.compute.dtype:
            raise ValueError(f"draft_model: the draft would compute in {compute.dtype}, the target in "
                             f"{self.platform.compute.dtype}; pass --dtype")
        dplan = make_plan(dcfg, compute, config.block_size, kv_bytes, self.max_model_len, matrices)
        self.plan = self.plan.with_draft(dplan)
        log.info("speculative decoding: draft model %s (%s, %d layers, %.1fM parameters)", source.name,
                 dcfg.architecture, dcfg.num_layers, dcfg.num_parameters() / 1e6)
        return DraftConfig(source, dcfg, compute.linear_method, compute.requant_type)

    # -- requests --------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.source.name

    def add_request(self, request_id: str, prompt: str | list[int] | ProcessedPrompt, params: SamplingParams,
                    stream: bool = False, arrival_time: float | None = None) -> None:
        """Queue a prompt: text, token ids, or a ProcessedPrompt the caller made with `input_processor`
        for these params (then it is not processed again)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        processed = self.input_processor.process(prompt, params)
        prompt_ids, max_tokens = processed.prompt_token_ids, processed.max_tokens
        spec = params.structured_outputs
        # compiled once (a ParamError now, before anything is queued; the server compiled it already: a cache hit)
        template = self.structured.compile(spec) if spec is not None else None
        now = arrival_time or time.monotonic()
        seqs: list[Request] = []
        for i in range(params.n):
            seed = params.seed if params.seed is None or i == 0 else hash((params.seed, i)) & 0x7FFF_FFFF_FFFF
            seqs.append(Request(f"{request_id}#{i}" if params.n > 1 else request_id, prompt_ids, params,
                                max_tokens, self.tokenizer.eog_token_ids, seed, seqs[0] if i else None, now))
        if template is not None:
            for r in seqs:
                r.grammar = template.deep_copy()  # each sequence its own grammar state
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
            self.scheduler.finish(r, status)  # the workers hear of it in the next step's finished_req_ids
            self.group_of.pop(r.request_id, None)
        st = self.output_processor.states.pop(request_id)
        st.error = error
        if not self.requests:
            self._send_finished(self.scheduler.take_finished_req_ids())
        return self.output_processor.make_output(st, force=True)

    def _send_finished(self, req_ids: set[str]) -> None:
        """Tell the workers which requests ended in a step that computes nothing: when nothing else is
        left to run, at once (their per-request state would otherwise wait for the next request)."""
        if req_ids:
            self.executor.execute_model(SchedulerOutput(finished_req_ids=req_ids))

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step --------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            self._send_finished(sched.finished_req_ids)
            return []
        self._fill_grammar_bitmask(sched)
        result = self.executor.execute_model(sched)
        for rid, chunk in result.prompt_logprobs.items():
            pst = self.output_processor.states.get(self.group_of.get(rid, rid))
            if pst is not None and pst.prompt_logprobs is not None:  # by position: a recompute overwrites
                pst.prompt_logprobs[chunk.start : chunk.start + len(chunk.entries)] = chunk.entries
        touched: dict[str, None] = {}
        for req in self.scheduler.update(sched, result):
            group_id = self.group_of.get(req.request_id, req.request_id)
            st = self.output_processor.states.get(group_id)
            if st is None:
                continue
            seq = next(q for q in st.seqs if q.request is req)
            lps = result.logprobs.get(req.request_id)
            new = result.sampled_token_ids[req.request_id]
            num_drafts = len(sched.spec_token_ids.get(req.request_id, ()))
            if num_drafts and self.spec is not None:
                self.spec.record(req, num_drafts, len(new) - 1)
            # the step's tokens (several after accepted drafts) go through the stop checker one at a time:
            # a stop, max_tokens or the grammar's end drops the tokens after it
            del req.token_ids[len(req.token_ids) - len(new) + 1 :]
            for j, token in enumerate(new):
                if j:
                    req.token_ids.append(token)
                if lps and seq.logprobs is not None:
                    seq.logprobs.append(lps[j])
                if req.grammar is not None:
                    self.structured.accept(req.grammar, token)
                status = self.stop_checker.check(req, seq)  # the one place that decides
                if status is not None:
                    if status is RequestStatus.FINISHED_ERROR and req.grammar is not None:
                        # the mask allowed a token the grammar then refused: text the vocabulary cannot write
                        st.error = ("structured output: the constraint needs text this model's vocabulary cannot "
                                    f"write (the grammar refused the sampled token: {req.grammar.get_error()})")
                        st.error_from_input = True
                    self.scheduler.finish(req, status)
                    break
            touched[group_id] = None
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
        if not self.requests:
            self._send_finished(self.scheduler.take_finished_req_ids())
        elif self.spec is not None:
            self.spec.propose(self.scheduler.running)
            # a step where every request decoded (its drafts included) teaches the rule what rows cost; its
            # time includes proposing the next step's drafts (what a drafting step costs on top of the rows)
            if all(n == 1 + len(sched.spec_token_ids.get(rid, ())) for rid, n in sched.num_scheduled_tokens.items()):
                self.spec.observe_step(sched.total_num_scheduled_tokens, len(sched.num_scheduled_tokens),
                                       time.perf_counter() - t0)
        return outputs

    def _fill_grammar_bitmask(self, sched: SchedulerOutput) -> None:
        """Put the next-token bitmask of every constrained request that samples this step into sched."""
        reqs = self.scheduler.requests
        owners = [rid for rid, n in sched.num_scheduled_tokens.items() if (r := reqs[rid]).grammar is not None
                  and r.num_computed_tokens + n - len(sched.spec_token_ids.get(rid, ())) == r.num_tokens]
        if owners:
            # a speculating request gets a row per draft position (the mask after its first j drafts)
            drafts = [sched.spec_token_ids.get(rid, []) for rid in owners]
            sched.grammar_bitmask = self.structured.fill_bitmask([reqs[rid].grammar for rid in owners], drafts)
            firsts = [0]
            for d in drafts[:-1]:
                firsts.append(firsts[-1] + 1 + len(d))
            sched.structured_output_request_ids = dict(zip(owners, firsts))

    # -- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        return {
            "num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": bm.usage, "num_free_blocks": bm.num_free_blocks, "num_blocks": bm.num_blocks,
            "block_size": self.config.block_size, "enable_prefix_caching": float(self.prefix_caching),
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": bm.num_queries, "prefix_cache_hits": bm.num_hits,
            **(self.spec.stats() if self.spec is not None else {}),
        }

    def describe(self) -> str:
        return f"{self.source.name} ({self.model_config.quantization}), {format_size(self.plan.weight_bytes)} weights"
