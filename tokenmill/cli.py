"""The `tokenmill` command: generate, chat, serve, plan, bench. Flags build the same EngineConfig.

The top of the layers: it parses flags and builds the rest; nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import json

from tokenmill.compute import DENSE_COPY_CHOICES, QUANTIZATION_CHOICES
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from tokenmill.config import EngineConfig, SpeculativeConfig, parse_size
from tokenmill.heap import one_arena
from tokenmill.entrypoints.openai.harmony import REASONING_PARSER as HARMONY_PARSER
from tokenmill.entrypoints.openai.reasoning import PARSERS as REASONING_PARSERS
from tokenmill.entrypoints.openai.tool_parsers.registry import PARSER_CHOICES
from tokenmill.entrypoints.vllm_flags import add_vllm_args, apply_vllm_args


def add_engine_args(p: argparse.ArgumentParser, positional_model: bool = True) -> None:
    if positional_model:  # serve: several models
        p.add_argument("model", nargs="*", default=[],
                       help="models to serve: .gguf files, HF-style directories, or 'default' (SmolLM2-135M-Instruct, "
                            "also what serve gets with no model and no --models-dir); the first is the default")
    g = p.add_argument_group("engine")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--kv-cache-memory", type=str, default=None,
                   help="KV cache budget, e.g. 2GiB (default: 1/4 of free RAM up to 2GiB on CPU, most of free GPU memory)")
    g.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=EngineConfig.max_num_batched_tokens,
                   help="token budget per step (prefill chunks + decodes; default 2048 at bf16 on CPUs with AMX "
                        "when big batches run on oneDNN, else 512)")
    g.add_argument("--block-size", type=int, default=EngineConfig.block_size, help="tokens per KV block")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable automatic prefix caching")
    g.add_argument("--state-checkpoints", type=int, default=None, metavar="N",
                   help="models with recurrent layers (Qwen3.5, LFM2): recurrent states kept at block boundaries "
                        "for prefix caching, from the KV cache's budget (default: as many as a quarter of it holds, "
                        "at most --max-num-seqs; 0: none, prefix caching off for such a model)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dtype", default="auto",
                   help="auto (bf16 on CUDA and on CPUs with AMX, else fp32), float32, bfloat16, float16")
    g.add_argument("--seed", type=int, default=0, help="seed for unseeded sampling")
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads for the model (default: all cores)")
    g.add_argument("--quantization", choices=["auto", *QUANTIZATION_CHOICES], default=None,
                   help="auto (default): a GGUF file on CPU keeps its quantized blocks (ggml's kernels), other "
                        "weights run at the compute dtype. dequantize: GGUF weights dequantized at load; "
                        "q8_0, q4_k, ...: every matrix quantized to that type at load (ggml's quantizer; a GGUF's "
                        "other quantized types requantized from their values); int8: "
                        "torch's weight-only int8")
    g.add_argument("--dense-copy", choices=DENSE_COPY_CHOICES, default="auto",
                   help="GGUF blocks on CPU: also keep a dense copy of the matmul weights for batches past the "
                        "block kernels' crossover (more memory, faster batches). auto (default): only with bf16 "
                        "compute oneDNN can prepack (CPUs with AMX or AVX512_BF16) and when the copy takes at most "
                        "1/8 of RAM; `tokenmill plan` shows it")
    g.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 6, '
                        '"prompt_lookup_max": 5}\', \'{"method": "draft_model", "model": "small.gguf"}\' or '
                        '\'{"method": "layer_skip", "num_draft_layers": 8}\' (README "Speculative decoding"; off '
                        'by default)')
    g.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="sampling defaults for requests that leave a field out: auto (default) the model's own "
                        "(generation_config.json, a GGUF's general.sampling.*), vllm none (each API's own "
                        "defaults), or a directory holding a generation_config.json (vLLM's flag)")
    g.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help='sampling defaults set on top of --generation-config\'s, with generation_config.json\'s key '
                        'names, e.g. \'{"temperature": 0.5, "top_p": 0.9}\' (vLLM\'s flag)')
    g.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template (a file's path, or the template text itself) to use instead of the "
                        "model's: for a GGUF without one, or to change how chats are rendered")


def engine_config_from_args(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    return EngineConfig(
        model=model or args.model, max_model_len=args.max_model_len, kv_cache_memory=parse_size(args.kv_cache_memory),
        block_size=args.block_size, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, state_checkpoints=getattr(args, "state_checkpoints", None),
        device=args.device, dtype=args.dtype, seed=args.seed,
        num_threads=args.num_threads, quantization=None if args.quantization == "auto" else args.quantization,
        dense_copy=args.dense_copy, speculative_config=SpeculativeConfig.parse(args.speculative_config),
        chat_template=getattr(args, "chat_template", None),
        gpu_memory_utilization=getattr(args, "vllm_gpu_util", None),
        generation_config=getattr(args, "generation_config", "auto"),
        override_generation_config=_json_flag("--override-generation-config",
                                              getattr(args, "override_generation_config", None)))


def _json_flag(flag: str, text: str | None) -> Any:
    """A flag's JSON value (None when not given); a ValueError naming the flag when it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"{flag} is not valid JSON ({e}): {text!r}") from None


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed-request", dest="request_seed", type=int, default=None, help="per-request sampling seed")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def sampling_from_args(args: argparse.Namespace) -> Any:
    from tokenmill.sampling_params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          seed=args.request_seed, stop=args.stop)


def cmd_generate(args: argparse.Namespace) -> int:
    from tokenmill.entrypoints.llm import LLM

    llm = LLM(**_llm_kwargs(args))
    params = sampling_from_args(args)
    prompts: list[Any] = list(args.prompt)
    if args.chat:
        prompts = [llm.engine.input_processor.render_chat_ids([{"role": "user", "content": p}]) for p in prompts]
    if args.stream and len(prompts) == 1:
        eng = llm.engine
        eng.add_request("cli-0", prompts[0], params, stream=True)
        while eng.has_unfinished_requests():
            for out in eng.step():
                sys.stdout.write(out.outputs[0].delta_text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    for p, out in zip(args.prompt, llm.generate(prompts, params)):
        if len(prompts) > 1:
            print(f"=== {p!r}")
        print(out.outputs[0].text)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tokenmill.entrypoints.llm import LLM

    llm = LLM(**_llm_kwargs(args))
    params = sampling_from_args(args)
    eng = llm.engine
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print(f"Chatting with {eng.model_name}. Empty line or Ctrl-D to quit; /reset clears the history.")
    # a harmony model (gpt-oss): its markers read, the analysis channel shown dimmed, only the final one kept
    from tokenmill.entrypoints.openai.harmony import Harmony

    harmony = Harmony.of(eng.tokenizer, None, None, announce=False)
    if harmony is not None:
        params.skip_special_tokens = False
    dim, plain = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")
    turn = 0
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line})
        ids = eng.input_processor.render_chat_ids(history, add_generation_prompt=True)
        rid = f"chat-{turn}"
        turn += 1
        reply = ""
        reader = harmony.reader(None, None, True).stream() if harmony is not None else None
        try:
            eng.add_request(rid, ids, params, stream=True)
            while eng.has_unfinished_requests():
                for out in eng.step():
                    delta = out.outputs[0].delta_text
                    if reader is not None:
                        news = reader.feed(delta, is_final=out.finished)
                        delta = f"{dim}{news.reasoning}{plain}" if news.reasoning else ""
                        if news.content and not reply and reader.sent["reasoning"]:
                            delta += "\n"  # the answer on a line of its own after the thinking
                        delta += news.content
                        reply += news.content
                    else:
                        reply = out.outputs[0].text
                    sys.stdout.write(delta)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            eng.abort_request(rid)
        except ValueError as e:  # e.g. the history outgrew the context
            print(f"error: {e}")
            history.pop()
            continue
        print()
        history.append({"role": "assistant", "content": reply})


def cmd_serve(args: argparse.Namespace) -> int:
    from tokenmill.entrypoints.anthropic import router as anthropic_router
    from tokenmill.entrypoints.ollama import router as ollama_router
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.server.config import ServerConfig
    from tokenmill.entrypoints.server.lifecycle import run_server
    from tokenmill.entrypoints.web import router as web_router

    from tokenmill.entrypoints.server.served_model import engine_config_for, name_models

    try:
        apply_vllm_args(args)  # vLLM's flags folded into ours, or refused
    except ValueError as e:
        print(f"tokenmill serve: {e}", file=sys.stderr)
        return 2
    problem = listen_problem(args.host, args.port)
    if problem is not None:  # before the model loads (seconds to minutes), not after
        print(f"tokenmill serve: {problem}", file=sys.stderr)
        return 2
    base = engine_config_from_args(args, "default")
    taken = [n for n in (args.served_model_name or [])[1:] if n == "default" or n.endswith(".gguf")
             or os.path.exists(n)]
    if taken:  # the flag takes every word after it: a model written after it became a name
        print(f"tokenmill serve: --served-model-name took {taken[0]!r} as another name for the model; put the "
              f"model before the flag (tokenmill serve {taken[0]} --served-model-name NAME)", file=sys.stderr)
        return 2
    try:
        named = name_models(args.model or ([] if args.models_dir else ["default"]), args.models_dir,
                            args.served_model_name[0] if args.served_model_name else None)
    except (ValueError, FileNotFoundError) as e:
        print(f"tokenmill serve: {e}", file=sys.stderr)
        return 2
    models = [(name, engine_config_for(base, model, len(named))) for name, model in named]
    # OpenAI's API under /v1, Anthropic's Messages at /v1/messages, Ollama's under /api, the chat page at /
    routers = [openai_router.build_router, anthropic_router.build_router, ollama_router.build_router,
               web_router.build_router]
    return run_server(ServerConfig.from_args(args), models, routers,
                      "An LLM inference server: OpenAI's API under /v1 (and Anthropic's Messages at /v1/messages), "
                      "Ollama's under /api, a chat page at /.")


def listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), found by binding a socket as uvicorn will
    (SO_REUSEADDR) and closing it: a bad port, an address that is not this machine's, a port in use."""
    import errno
    import socket

    if not 0 <= port <= 65535:
        return f"--port {port} is not a port number (0-65535)"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"--host {host!r} is not an address to listen on ({e.strerror})"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            hint = ("another process listens there: stop it or choose another --port" if e.errno == errno.EADDRINUSE
                    else "--host must be an address of this machine (127.0.0.1, 0.0.0.0, or one of its own)"
                    if e.errno == errno.EADDRNOTAVAIL else "")
            return f"cannot listen on {host}:{port}: {e.strerror}" + (f"; {hint}" if hint else "")
    return None


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None, nargs="+", metavar="NAME",
                   help="the name clients use for a single model (default: the model's); more names after it are "
                        "aliases requests may use too (vLLM's form), the first is the one answers carry")
    g.add_argument("--models-dir", default=None, metavar="DIR",
                   help="also serve every .gguf file and HF-style directory in DIR, named as Ollama names them "
                        "(smollm2:135m from the GGUF's name and size label, else the file stem)")
    g.add_argument("--default-model", default=None, metavar="NAME",
                   help="the model a request without one gets, loaded at start (default: the first)")
    g.add_argument("--keep-alive", type=_duration, default=None, metavar="DURATION",
                   help="how long an idle model stays loaded: 5m, 1h, 300 (seconds), 0 (unload at once), -1 (never); "
                        "a request's keep_alive overrides it (default: 5m with several models, never with one)")
    g.add_argument("--models-memory", type=_size, default=None, metavar="SIZE",
                   help="what the loaded models may take together, by their memory plans (weights + KV cache), "
                        "e.g. 8GiB; past it the least recently used idle model is unloaded first (default: the RAM "
                        "available at start)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health, /metrics and the chat page's "
                        "files (or set TOKENMILL_API_KEY); compared in constant time")
    g.add_argument("--metrics-prefix", choices=["tokenmill", "vllm"], default="tokenmill",
                   help="the /metrics names' prefix: tokenmill: (default) or vllm:, so that dashboards and alerts "
                        "built for vLLM's server (vllm:num_requests_running, ...) read them unchanged")
    g.add_argument("--metrics-require-key", action="store_true",
                   help="require the API key on /metrics too (by default /metrics is open, for scrapers)")
    g.add_argument("--max-waiting-requests", type=int, default=None,
                   help="answer 503 with Retry-After when this many requests already wait (default: no limit)")
    g.add_argument("--max-request-bytes", type=_size, default="4MiB",
                   help="largest request body; larger ones get 413 before they are read (default 4MiB; 0: no limit)")
    g.add_argument("--request-timeout", type=_seconds(allow_zero=False), default=None,
                   help="seconds a request may run (queue + generation) before it is aborted with a 408 "
                        "(streams: an error event, then [DONE]); default: no limit")
    g.add_argument("--watchdog-timeout", type=_seconds(allow_zero=True), default=None,
                   help="seconds one engine step may take while requests wait; past it the engine is declared "
                        "stalled: /health answers 503, waiting requests fail, the server exits 1 (default 300; "
                        "0: no watchdog)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, seconds in-flight requests may take before they are aborted (default 30)")
    g.add_argument("--cors-origins", default=None, help="comma-separated origins allowed by CORS (default: none)")
    g.add_argument("--log-prompts", action="store_true",
                   help="log each request's prompt text (off by default: logs never contain prompts or outputs)")
    g.add_argument("--access-log", action="store_true", help="log every HTTP request (off by default)")
    g.add_argument("--tool-call-parser", default="auto", choices=PARSER_CHOICES,
                   help="the format chat reads tool calls in (tool_choice auto): hermes (Hermes, Qwen2.5, Qwen3), "
                        "qwen3_coder (Qwen3-Coder, Qwen3.5: <function=...> XML), llama3_json (Llama 3.1+), mistral, "
                        "openai (gpt-oss's harmony); auto (default): detected from the chat template, hermes when "
                        "the template renders no tools")
    g.add_argument("--reasoning-parser", default=None, choices=(*REASONING_PARSERS, HARMONY_PARSER),
                   help="split a thinking model's <think> ... </think> text from its answer: chat returns it as "
                        "reasoning_content (Ollama: thinking). qwen3 (Qwen3, QwQ) and deepseek_r1 (DeepSeek-R1 and "
                        "its distills) read the same tags; default: off, the text stays in the content. "
                        "openai_gptoss: gpt-oss's harmony format (on by itself for a harmony chat template)")
    g.add_argument("--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"])


def _size(value: str) -> int:
    """argparse type: a size such as 4MiB, as bytes."""
    try:
        size = parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size is None or size < 0:
        raise argparse.ArgumentTypeError(f"a size must not be negative, got {value!r}")
    return size


def _duration(value: str) -> str:
    """argparse type: an Ollama keep-alive duration (checked; kept as written)."""
    from tokenmill.entrypoints.server.served_model import parse_keep_alive

    try:
        parse_keep_alive(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _seconds(allow_zero: bool) -> Callable[[str], float]:
    """argparse type: a number of seconds, above 0 (or 0 and more with `allow_zero`)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not (number >= 0 if allow_zero else number > 0):
            raise argparse.ArgumentTypeError(f"must {'not be negative' if allow_zero else 'be above 0'}, got {value!r}")
        return number

    return parse


def _llm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    cfg = engine_config_from_args(args)
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill", description="A small LLM inference server.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="generate text for one or more prompts (batched)")
    g.add_argument("prompt", nargs="+", help="prompt text (several prompts run as one batch)")
    g.add_argument("--model", default="default", help="a .gguf file, an HF-style directory, or 'default'")
    g.add_argument("--stream", action="store_true", help="print tokens as they come (one prompt)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    add_engine_args(g, positional_model=False)
    add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="an interactive chat in the terminal that keeps the history")
    c.add_argument("--model", default="default", help="a .gguf file, an HF-style directory, or 'default'")
    c.add_argument("--system", default=None, help="a system prompt")
    add_engine_args(c, positional_model=False)
    add_sampling_args(c, max_tokens=512)
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API, Ollama's under /api, and a chat page at / "
                                     "for browsers")
    add_engine_args(s)
    add_serve_args(s)
    add_vllm_args(s)
    s.set_defaults(func=cmd_serve)

    pl = sub.add_parser("plan", help="the memory arithmetic for a model and settings, before loading anything")
    from tokenmill.entrypoints.plan import add_plan_args, run_plan

    add_plan_args(pl)
    pl.set_defaults(func=run_plan)

    from tokenmill.benchmarks.commands import add_bench_parser
    from tokenmill.entrypoints.convert import add_convert_parser

    add_bench_parser(sub)  # bench serve | plot | compare | throughput | latency | soak
    add_convert_parser(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The innermost (sub)command's parser that argv names, e.g. `tokenmill bench serve`'s: an unknown flag
    is reported with that command's usage, not the top level's (argparse's own habit)."""
    for tok in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if tok in subs[0].choices:
            parser = subs[0].choices[tok]
    return parser


def main(argv: list[str] | None = None) -> int:
    one_arena()  # before any thread starts: an unloaded model's memory can then all go back (tokenmill/heap.py)
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parser.parse_known_args(argv)
    if extra:
        _command_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:
        print(f"tokenmill: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
