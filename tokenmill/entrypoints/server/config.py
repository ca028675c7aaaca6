"""ServerConfig: every server setting, frozen, built once from the `serve` flags (or keyword arguments)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from tokenmill.engine.async_engine import DEFAULT_WATCHDOG_TIMEOUT
from tokenmill.entrypoints.server.served_model import DEFAULT_KEEP_ALIVE, parse_keep_alive
from tokenmill.metrics import PREFIX as METRICS_PREFIX

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a 128K-token prompt is ~1 MiB of JSON; 4 MiB leaves room, and no more


@dataclass(frozen=True)
class ServerConfig:
    """What the app (`build_app`) and the process (`run_server`) are told; None means "no limit" / "off"."""

    # the app
    served_model_name: str | None = None  # the name clients use; None: the model's own
    served_model_aliases: tuple[str, ...] = ()  # further names requests may use for it (vLLM's extra names)
    api_key: str | None = None  # 'Authorization: Bearer <key>' on every route but /health (and /metrics)
    metrics_require_key: bool = False
    metrics_prefix: str = METRICS_PREFIX  # or "vllm:" (--metrics-prefix vllm): as vLLM's dashboards read them
    cors_origins: tuple[str, ...] = ()
    max_waiting_requests: int | None = None  # admission: 503 with Retry-After past this many waiting
    max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES  # 413 past it
    request_timeout: float | None = None  # seconds from admission to the last token
    log_requests: bool = True
    log_prompts: bool = False  # prompt text in the log, only when asked for
    tool_call_parser: str = "auto"  # the tool-call format chat reads (tool_parsers/); auto: from the template
    reasoning_parser: str | None = None  # qwen3 / deepseek_r1: <think> text split out as reasoning (reasoning.py)
    # the models (model_pool.py)
    keep_alive: str | None = None  # an idle model's stay (Ollama's durations); None: keep_alive_seconds' rule
    models_memory: int | None = None  # bytes the loaded models may take together; None: RAM available at start
    default_model: str | None = None  # the model a request without one gets; None: the first
    # the process
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    access_log: bool = False
    shutdown_timeout: float = 30.0  # seconds in-flight requests get after SIGTERM
    watchdog_timeout: float | None = DEFAULT_WATCHDOG_TIMEOUT  # seconds one engine step may take

    def __post_init__(self) -> None:
        if self.max_waiting_requests is not None and self.max_waiting_requests < 0:
            raise ValueError(f"max_waiting_requests must not be negative, got {self.max_waiting_requests}")
        if self.max_request_bytes is not None and self.max_request_bytes < 0:
            raise ValueError(f"max_request_bytes must not be negative, got {self.max_request_bytes}")
        if self.keep_alive is not None:
            try:
                parse_keep_alive(self.keep_alive)
            except ValueError as e:
                raise ValueError(f"keep_alive: {e}") from None
        if self.models_memory is not None and self.models_memory <= 0:
            raise ValueError(f"models_memory must be positive, got {self.models_memory}")
        for name in ("request_timeout", "watchdog_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be above 0 seconds (or None: no limit), got {value}")

    def keep_alive_seconds(self, num_models: int) -> float | None:
        """Seconds an idle model stays loaded (None: never): --keep-alive; unset, a single model stays (as
        it always has) and several stay DEFAULT_KEEP_ALIVE (Ollama's 5 minutes)."""
        if self.keep_alive is not None:
            return parse_keep_alive(self.keep_alive)
        return None if num_models == 1 else DEFAULT_KEEP_ALIVE

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """From the `serve` flags: the API key falls back to $TOKENMILL_API_KEY, --cors-origins is split
        at commas, and 0 turns --max-request-bytes and --watchdog-timeout off."""
        cors = tuple(o.strip() for o in (args.cors_origins or "").split(",") if o.strip())
        watchdog = getattr(args, "watchdog_timeout", None)  # None: the default
        api_key = args.api_key or os.environ.get("TOKENMILL_API_KEY") or None
        return cls(
            served_model_name=args.served_model_name[0] if args.served_model_name else None,
            served_model_aliases=tuple(args.served_model_name[1:]) if args.served_model_name else (), api_key=api_key, metrics_require_key=args.metrics_require_key,
            metrics_prefix=f"{getattr(args, 'metrics_prefix', 'tokenmill')}:",
            cors_origins=cors,
            max_waiting_requests=args.max_waiting_requests, max_request_bytes=args.max_request_bytes or None,
            request_timeout=args.request_timeout, log_prompts=args.log_prompts,
            log_requests=not getattr(args, "vllm_disable_log_requests", False),
            tool_call_parser=getattr(args, "tool_call_parser", "auto"),
            reasoning_parser=getattr(args, "reasoning_parser", None), keep_alive=getattr(args, "keep_alive", None),
            models_memory=getattr(args, "models_memory", None), default_model=getattr(args, "default_model", None),
            host=args.host, port=args.port,
            log_level=args.log_level, access_log=args.access_log, shutdown_timeout=args.shutdown_timeout,
            watchdog_timeout=DEFAULT_WATCHDOG_TIMEOUT if watchdog is None else watchdog or None)
