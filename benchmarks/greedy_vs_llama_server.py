"""Greedy text of tokenmill (GGUF blocks on ggml's kernels) against llama-server on the same file.

    .venv/bin/python benchmarks/greedy_vs_llama_server.py [--model file.gguf] [--max-tokens 32]

Starts both servers in turn (llama-server from benchmarks/peers/build_llama_server.sh), sends the same
prompts to /v1/completions at temperature 0, one at a time, and prints how many answers are identical and,
for the others, after how many characters they part. Both run the same kind of kernels (8-bit
activations), so they should mostly agree; where they differ it is at a near-tie.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "The three primary colors are", "To make a cup of tea, first", "import numpy as np\n\n# compute the mean",
    "The largest planet in the solar system is", "Water boils at", "A haiku about autumn:\n",
    "Q: What is 12 times 7?\nA:", "The French word for cat is", "SELECT name FROM users WHERE",
    "In 1492, Columbus", "The opposite of hot is", "My favourite book is", "Photosynthesis is the process",
]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


def answers(cmd: list[str], port: int, max_tokens: int) -> list[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        out = []
        for p in PROMPTS:
            r = httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0})
            out.append(r.json()["choices"][0]["text"])
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=8351)
    ap.add_argument("--json", default=None, help="write both answer lists here")
    ap.add_argument("--tokenmill-args", default="", help="extra flags for tokenmill serve, e.g. '--quantization dequantize'")
    args = ap.parse_args()
    from tokenmill.loader.model_source import default_model_path

    model = args.model or str(default_model_path())
    llama = subprocess.run([str(ROOT / "benchmarks/peers/build_llama_server.sh")], capture_output=True, text=True,
                           check=True).stdout.strip().splitlines()[-1]
    threads = str(os.cpu_count() or 1)
    ours = answers([sys.executable, "-m", "tokenmill.cli", "serve", model, "--port", str(args.port),
                    "--max-model-len", "512", "--kv-cache-memory", "64MiB", *args.tokenmill_args.split()],
                   args.port, args.max_tokens)
    theirs = answers([llama, "-m", model, "--port", str(args.port), "--ctx-size", "512", "--threads", threads],
                     args.port, args.max_tokens)
    same = 0
    for p, a, b in zip(PROMPTS, ours, theirs):
        if a == b:
            same += 1
            continue
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"differ after {n} chars: {p!r}\n  tokenmill:    {a!r}\n  llama-server: {b!r}")
    print(f"identical greedy answers: {same}/{len(PROMPTS)} ({args.max_tokens} tokens each)")
    if args.json:
        Path(args.json).write_text(json.dumps({"prompts": PROMPTS, "tokenmill": ours, "llama_server": theirs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
