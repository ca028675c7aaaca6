"""`tokenmill bench ...`: registers serve, soak, plot, compare, throughput, structured, latency and spec on the CLI.

Imports of the benchmark modules happen when a command runs, so `tokenmill --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

from tokenmill.compute import QUANTIZATION_CHOICES


def _cmd_serve(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.serve import cmd_bench_serve

    return cmd_bench_serve(args)


def _cmd_soak(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.soak import cmd_bench_soak

    return cmd_bench_soak(args)


def _cmd_plot(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.plot import cmd_bench_plot

    return cmd_bench_plot(args)


def _cmd_compare(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.compare import cmd_bench_compare

    return cmd_bench_compare(args)


def _offline_llm(args: argparse.Namespace, **extra: Any):  # type: ignore[no-untyped-def]
    from tokenmill.entrypoints.llm import LLM

    return LLM(args.model, progress=False, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
               dtype=args.dtype, quantization=None if args.quantization == "auto" else args.quantization,
               num_threads=args.num_threads, **extra)


def _emit(args: argparse.Namespace, llm: object, kind: str, result: dict[str, object]) -> int:
    import os

    rec = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "model": llm.engine.model_name, kind: result}  # type: ignore[attr-defined]
    print(json.dumps(rec, indent=2))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(rec, f, indent=2)
    return 0


def _cmd_throughput(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.throughput import run_throughput

    llm = _offline_llm(args)
    return _emit(args, llm, "throughput",
                 run_throughput(llm, args.num_prompts, args.input_len, args.output_len, args.seed, args.prompts,
                                args.save_prompts))


def _cmd_latency(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.throughput import run_latency

    llm = _offline_llm(args)
    return _emit(args, llm, "latency", run_latency(llm, args.input_len, args.output_len, args.seed))


def _cmd_structured(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.structured import run_structured

    llm = _offline_llm(args)
    return _emit(args, llm, "structured", run_structured(llm, args.concurrency, args.rounds, args.temperature,
                                                         args.output_len, args.seed, args.save_workload))


def _cmd_spec(args: argparse.Namespace) -> int:
    from tokenmill.benchmarks.spec import run_spec
    from tokenmill.config import SpeculativeConfig

    config = SpeculativeConfig.parse(args.speculative_config) or SpeculativeConfig()
    off, on = _offline_llm(args), _offline_llm(args, speculative_config=config)
    return _emit(args, on, "spec", run_spec(off, on, args.workload, args.concurrency, args.output_len, args.repeats,
                                            args.seed, args.prompts_file))


def _offline_args(p: argparse.ArgumentParser, output_len: int) -> None:
    p.add_argument("--model", default="default", help="a .gguf file, an HF-style directory, or 'default'")
    p.add_argument("--input-len", type=int, default=200, help="prompt tokens (random ids, unique first tokens)")
    p.add_argument("--output-len", type=int, default=output_len, help="generated tokens (ignore_eos)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="as for serve (default: its default)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 (as for serve)")
    p.add_argument("--quantization", choices=["auto", *QUANTIZATION_CHOICES], default=None, help="as for serve")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", default=None, help="write the result here")


def add_soak_args(p: argparse.ArgumentParser) -> None:
    """The flags of `tokenmill bench soak` (here, not in soak.py, which needs httpx: a `bench` extra)."""
    p.add_argument("--url", default=None, help="target a running server (default: start one)")
    # checked answers must not depend on the batch: fp32 with dequantized weights (the GGUF-block method
    # and bf16 pick kernels by batch size)
    p.add_argument("--server-args", default="--max-num-seqs 64 --dtype float32 --quantization dequantize",
                   help="flags for the server it starts")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--warmup-requests", type=int, default=500, help="sent first; RSS is compared from there")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--disconnect-fraction", type=float, default=0.3)
    p.add_argument("--random-fraction", type=float, default=0.5, help="share with random sampling parameters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-interval", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")


def add_bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tokenmill bench {serve,soak,plot,compare,throughput,structured,latency}`."""
    from tokenmill.benchmarks.compare import add_compare_args
    from tokenmill.benchmarks.plot import add_plot_args
    from tokenmill.benchmarks.serve import add_serve_bench_args

    b = sub.add_parser("bench", help="benchmarks: serve (load test a server), soak, plot, compare, throughput, "
                                     "structured, latency, spec")
    bsub = b.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    s = bsub.add_parser("serve", help="load-test an OpenAI-compatible server (TTFT, TPOT, ITL, throughput)")
    add_serve_bench_args(s)
    s.set_defaults(func=_cmd_serve)

    k = bsub.add_parser("soak", help="many requests with random hang-ups, every answer checked, the server left idle")
    add_soak_args(k)
    k.set_defaults(func=_cmd_soak)

    p = bsub.add_parser("plot", help="plot TTFT and throughput vs concurrency from result JSONs")
    add_plot_args(p)
    p.set_defaults(func=_cmd_plot)

    c = bsub.add_parser("compare", help="tables of results and of ratios against a baseline server")
    add_compare_args(c)
    c.set_defaults(func=_cmd_compare)

    t = bsub.add_parser("throughput", help="offline throughput through the Python API")
    _offline_args(t, output_len=128)
    t.add_argument("--num-prompts", type=int, default=64)
    t.add_argument("--prompts", choices=["ids", "serve"], default="ids",
                   help="ids: random token ids; serve: the random text prompts `bench serve --num-warmups 0` sends "
                        "with the same --seed and counts (to compare a server with the engine on the same prompts)")
    t.add_argument("--save-prompts", default=None, help="write the prompts' token ids here (JSON), e.g. for "
                   "benchmarks/peers/vllm_offline.py")
    t.set_defaults(func=_cmd_throughput)

    st = bsub.add_parser("structured", help="throughput with every request under a JSON schema vs unconstrained")
    _offline_args(st, output_len=400)
    st.add_argument("--concurrency", type=int, default=16, help="requests at once (set --max-num-seqs to match)")
    st.add_argument("--rounds", type=int, default=3)
    st.add_argument("--temperature", type=float, default=0.0)
    st.add_argument("--save-workload", default=None, help="write the prompts and schemas here (JSON), for "
                    "benchmarks/peers/vllm_structured.py")
    st.set_defaults(func=_cmd_structured)

    sp = bsub.add_parser("spec", help="speculative decoding on against off, same prompts, same run")
    _offline_args(sp, output_len=256)
    sp.add_argument("--workload", choices=["grounded", "random"], default="grounded")
    sp.add_argument("--prompts-file", default=None, help="grounded: a JSON of name -> chat messages "
                    "(default: the grounded prompts shipped in tokenmill/benchmarks/prompts/spec_grounded.json)")
    sp.add_argument("--concurrency", type=int, default=1)
    sp.add_argument("--repeats", type=int, default=2)
    sp.add_argument("--speculative-config", default=None, help="JSON (default: ngram with its defaults)")
    sp.set_defaults(func=_cmd_spec)

    lat = bsub.add_parser("latency", help="one request: prefill tok/s and decode tok/s")
    _offline_args(lat, output_len=128)
    lat.set_defaults(func=_cmd_latency)
