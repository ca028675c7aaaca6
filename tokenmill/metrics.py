"""ServerMetrics: Prometheus metrics with vLLM's names under the `tokenmill:` prefix (or vLLM's own `vllm:`, with
`--metrics-prefix vllm`), and the request log.

Each app gets its own CollectorRegistry (no process-global state, so tests can build many apps), one for
every model it serves: each metric is one family, and each model is its `model_name` label value, so the
exposition stays valid however many models are loaded. Request histograms and counters are fed by a
model's `ModelMetrics.on_step`, an AsyncEngine step hook that runs on its engine thread (prometheus_client
is thread-safe); they outlive an unload (they count what the server answered). Engine-wide gauges and
counters (running, waiting, KV usage, preemptions, prefix cache) are read from each loaded engine's
`stats()` at scrape time, so they are never stale, and a model that is not loaded has none.

The server adds every request to the engine with stream=True, so each step that makes tokens yields an
output: that is what lets `on_step` time inter-token latency for streaming and non-streaming alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenmill.outputs import FinishReason, RequestOutput

request_log = logging.getLogger("tokenmill.requests")

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
FINISH_REASONS = ("stop", "length", "abort", "error")
# the names' prefix: ours, or vLLM's (--metrics-prefix vllm), so that dashboards built for vLLM read them as they are
PREFIX = "tokenmill:"
PREFIXES = (PREFIX, "vllm:")


@dataclass
class _Live:
    """What on_step remembers about one unfinished request."""

    last_token_time: float | None = None


# (model name, its engine's stats()) for every loaded model, at scrape time
EngineStats = Callable[[], Iterable[tuple[str, dict[str, float]]]]


class _EngineCollector(Collector):
    """Gauges and cumulative counters read from each loaded engine's stats() when Prometheus scrapes:
    one family per metric, a sample per model."""

    def __init__(self, engines: EngineStats, prefix: str) -> None:
        self.engines = engines
        self.prefix = prefix

    def collect(self) -> Iterable[Metric]:
        loaded = list(self.engines())
        for name, doc, key in (
            ("num_requests_running", "Sequences running in the engine.", "num_running"),
            ("num_requests_waiting", "Sequences waiting to be scheduled.", "num_waiting"),
            ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).", "kv_cache_usage"),
        ):
            g = GaugeMetricFamily(f"{self.prefix}{name}", doc, labels=["model_name"])
            for model, s in loaded:
                g.add_metric([model], float(s[key]))
            yield g
        for name, doc, key in (
            ("num_preemptions", "Sequences preempted (their KV freed, to recompute).", "num_preemptions"),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
        ):
            c = CounterMetricFamily(f"{self.prefix}{name}", doc, labels=["model_name"])
            for model, s in loaded:
                c.add_metric([model], float(s[key]))
            yield c
        info = GaugeMetricFamily(f"{self.prefix}cache_config_info", "The KV cache's settings (as labels; value 1).",
                                 labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"])
        for model, s in loaded:
            if "block_size" in s:
                info.add_metric([model, str(int(s["block_size"])), str(int(s["num_blocks"])),
                                 str(bool(s.get("enable_prefix_caching", 0.0)))], 1.0)
        yield info
        speculating = [(model, s) for model, s in loaded if "spec_decode_num_drafts" in s]
        if not speculating:
            return
        # speculative decoding, vLLM's names (under this server's prefix)
        for name, doc in (("spec_decode_num_drafts", "Verification runs: a request's drafts checked in a step."),
                          ("spec_decode_num_draft_tokens", "Draft tokens proposed and verified."),
                          ("spec_decode_num_accepted_tokens", "Draft tokens accepted.")):
            c = CounterMetricFamily(f"{self.prefix}{name}", doc, labels=["model_name"])
            for model, s in speculating:
                c.add_metric([model], float(s[name]))
            yield c
        c = CounterMetricFamily(f"{self.prefix}spec_decode_num_accepted_tokens_per_pos",
                                "Draft tokens accepted, by their position in the draft (0 = first).",
                                labels=["model_name", "position"])
        prefix = "spec_decode_num_accepted_tokens_per_pos_"
        for model, s in speculating:
            for key in sorted((k for k in s if k.startswith(prefix)), key=lambda k: int(k[len(prefix):])):
                c.add_metric([model, key[len(prefix):]], float(s[key]))
        yield c


class ServerMetrics:
    """All of the server's metrics, over every model it serves (`model(name)`: one model's hooks).

    Built with a `model_name` and its `stats`, it serves that one model, and `on_step` / `on_request_error`
    are that model's (the one-model server, and tests); with `engines` instead, the gauges come from
    every loaded model."""

    def __init__(self, model_name: str | None = None, stats: Callable[[], dict[str, float]] | None = None,
                 log_requests: bool = True, engines: EngineStats | None = None, prefix: str = PREFIX) -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix must be one of {', '.join(PREFIXES)}, got {prefix!r}")
        self.log_requests = log_requests
        self.registry = CollectorRegistry()
        self._models: dict[str, ModelMetrics] = {}
        r, lbl = self.registry, ["model_name"]

        def hist(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"{prefix}{name}", doc, lbl, buckets=buckets, registry=r)

        self.families: dict[str, Any] = {
            "ttft": hist("time_to_first_token_seconds", "Arrival to first output token."),
            "itl": hist("inter_token_latency_seconds", "Time between consecutive output tokens."),
            "tpot": hist("request_time_per_output_token_seconds", "Decode time per output token after the first."),
            "e2e": hist("e2e_request_latency_seconds", "Arrival to finish."),
            "queue": hist("request_queue_time_seconds", "Arrival to first scheduled."),
            "prefill": hist("request_prefill_time_seconds", "First scheduled to first token."),
            "decode": hist("request_decode_time_seconds", "First token to finish."),
            "inference": hist("request_inference_time_seconds", "First scheduled to finish."),
            "prompt_len": hist("request_prompt_tokens", "Prompt tokens per request.", _TOKEN_BUCKETS),
            "gen_len": hist("request_generation_tokens", "Output tokens per request (all choices).", _TOKEN_BUCKETS),
            "max_gen_len": hist("request_max_num_generation_tokens", "Output tokens of a request's longest choice.",
                                _TOKEN_BUCKETS),
            "max_tokens": hist("request_params_max_tokens", "max_tokens of requests that set it.", _TOKEN_BUCKETS),
            "n": hist("request_params_n", "Sequences (n) per request.", (1, 2, 5, 10, 20)),
            "prompt_tokens": Counter(f"{prefix}prompt_tokens", "Prompt tokens of finished requests.", lbl,
                                     registry=r),
            "generation_tokens": Counter(f"{prefix}generation_tokens", "Output tokens generated.", lbl, registry=r),
            "success": Counter(f"{prefix}request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=r),
        }
        self._first: ModelMetrics | None = None
        if model_name is not None:
            self._first = self.model(model_name)
            if engines is None and stats is not None:
                engines = _one_engine(model_name, stats)
        r.register(_EngineCollector(engines or (lambda: []), prefix))

    def model(self, name: str) -> ModelMetrics:
        """One model's request metrics and hooks (made on first use, then the same object)."""
        if name not in self._models:
            self._models[name] = ModelMetrics(self, name)
        return self._models[name]

    # -- the one model's hooks ---------------------------------------------------------------------------
    def on_step(self, outputs: list[RequestOutput]) -> None:
        assert self._first is not None, "ServerMetrics was built without a model: use model(name).on_step"
        self._first.on_step(outputs)

    def on_request_error(self) -> None:
        assert self._first is not None, "ServerMetrics was built without a model: use model(name)"
        self._first.on_request_error()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class ModelMetrics:
    """One model's labelled request metrics. `on_step` is its AsyncEngine step hook."""

    def __init__(self, server: ServerMetrics, model_name: str) -> None:
        self.model_name = model_name
        self.log_requests = server.log_requests
        self._live: dict[str, _Live] = {}
        f = server.families
        self.ttft, self.itl, self.tpot, self.e2e = (f[k].labels(model_name) for k in ("ttft", "itl", "tpot", "e2e"))
        self.queue, self.prefill, self.decode = (f[k].labels(model_name) for k in ("queue", "prefill", "decode"))
        self.prompt_len, self.gen_len = f["prompt_len"].labels(model_name), f["gen_len"].labels(model_name)
        self.inference, self.max_gen_len = f["inference"].labels(model_name), f["max_gen_len"].labels(model_name)
        self.max_tokens, self.n = f["max_tokens"].labels(model_name), f["n"].labels(model_name)
        self.prompt_tokens = f["prompt_tokens"].labels(model_name)
        self.generation_tokens = f["generation_tokens"].labels(model_name)
        self.finished = {reason: f["success"].labels(model_name, reason) for reason in FINISH_REASONS}

    # -- hooks -------------------------------------------------------------------------------------------
    def on_step(self, outputs: list[RequestOutput]) -> None:
        """AsyncEngine step hook (engine thread): time tokens, and account requests that finished."""
        now = time.monotonic()
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:
                live = self._live[out.request_id] = _Live()
            num_new = sum(len(c.delta_token_ids) for c in out.outputs)
            if num_new:
                self.generation_tokens.inc(num_new)
                if live.last_token_time is None:
                    if out.metrics is not None:
                        self.ttft.observe(now - out.metrics.arrival_time)
                else:
                    gap = (now - live.last_token_time) / num_new
                    for _ in range(num_new):
                        self.itl.observe(gap)
                live.last_token_time = now
            if out.finished:
                del self._live[out.request_id]
                self._on_finished(out, now)

    def on_request_error(self) -> None:
        """A request that failed outside the engine's outputs (the serving layer answered 500)."""
        self.finished["error"].inc()

    def _on_finished(self, out: RequestOutput, now: float) -> None:
        reasons = {c.finish_reason for c in out.outputs}
        reason: FinishReason = out.outputs[0].finish_reason or FinishReason.ABORT
        for worst in (FinishReason.ABORT, FinishReason.ERROR):  # the last match wins: error over abort
            if worst in reasons:
                reason = worst
        self.finished[reason.value].inc()
        num_prompt = len(out.prompt_token_ids)
        num_output = sum(len(c.token_ids) for c in out.outputs)
        self.prompt_tokens.inc(num_prompt)
        self.prompt_len.observe(num_prompt)
        self.gen_len.observe(num_output)
        self.max_gen_len.observe(max((len(c.token_ids) for c in out.outputs), default=0))
        m = out.metrics
        if m is None:
            return
        self.n.observe(m.n)
        if m.max_tokens is not None:
            self.max_tokens.observe(m.max_tokens)
        e2e = now - m.arrival_time
        self.e2e.observe(e2e)
        queue = prefill = decode = ttft = None
        if m.first_scheduled_time is not None:
            queue = m.first_scheduled_time - m.arrival_time
            self.queue.observe(queue)
            self.inference.observe(now - m.first_scheduled_time)
        if m.first_token_time is not None:
            ttft = m.first_token_time - m.arrival_time
            decode = now - m.first_token_time
            self.decode.observe(decode)
            if m.first_scheduled_time is not None:
                prefill = m.first_token_time - m.first_scheduled_time
                self.prefill.observe(prefill)
            num_first = len(out.outputs[0].token_ids)
            if num_first > 1:
                self.tpot.observe(decode / (num_first - 1))
        if self.log_requests:  # one line per request; never the prompt or output text
            request_log.info(
                "request %s finished: %s, prompt %d tokens, output %d tokens, queue %s, ttft %s, total %.3fs%s",
                out.request_id, reason.value, num_prompt, num_output, _secs(queue), _secs(ttft), e2e,
                f", error: {out.error}" if out.error else "")


def _one_engine(model_name: str, stats: Callable[[], dict[str, float]]) -> EngineStats:
    def engines() -> list[tuple[str, dict[str, float]]]:
        return [(model_name, stats())]

    return engines


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"
