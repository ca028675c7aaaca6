"""The grounded speculative-decoding workload against a running OpenAI-compatible server (tokenmill or
vLLM), so that servers with and without speculation are measured by one client, in one run.

    python benchmarks/spec_serve.py --url http://127.0.0.1:8000 --model NAME --ids ids.json --json out.json

ids.json: name -> the prompt's token ids, rendered once (with tokenmill's /tokenize: `--make-ids` writes
it from benchmarks/prompts/spec_grounded.json), so that every server gets the same tokens through
/v1/completions. Per case: one short warm-up request (the prompt then sits in the prefix cache, as in
`tokenmill bench spec`), then `--repeats` greedy requests of `--output-len` tokens one at a time (C=1);
output tok/s = completion tokens / wall time over the repeats. The speed-up is the ratio of two such
runs, one against a server without speculation and one with (benchmarks/spec_vs_vllm.sh).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

GROUNDED = Path(__file__).resolve().parent / "prompts" / "spec_grounded.json"


def make_ids(url: str, out: Path) -> None:
    convs = json.loads(GROUNDED.read_text())
    ids = {}
    for name, messages in convs.items():
        r = httpx.post(f"{url}/tokenize", json={"messages": messages, "add_generation_prompt": True}, timeout=60)
        r.raise_for_status()
        ids[name] = r.json()["tokens"]
    out.write_text(json.dumps(ids))


def run(url: str, model: str, ids: dict[str, list[int]], repeats: int, output_len: int) -> dict[str, object]:
    cases: dict[str, object] = {}
    with httpx.Client(timeout=600) as client:
        for name, prompt in ids.items():
            body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 2}
            client.post(f"{url}/v1/completions", json=body).raise_for_status()  # warm, prefix cached
            tokens, texts, t0 = 0, set(), time.perf_counter()
            for _ in range(repeats):
                r = client.post(f"{url}/v1/completions", json={**body, "max_tokens": output_len})
                r.raise_for_status()
                out = r.json()
                tokens += out["usage"]["completion_tokens"]
                texts.add(out["choices"][0]["text"])
            wall = time.perf_counter() - t0
            cases[name] = {"tok_per_s": tokens / wall, "completion_tokens": tokens, "wall_s": wall,
                           "distinct_texts": len(texts), "text": sorted(texts)[0]}
    return {"url": url, "model": model, "repeats": repeats, "output_len": output_len, "cases": cases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--ids", required=True, type=Path)
    p.add_argument("--make-ids", action="store_true", help="render the grounded prompts through --url's /tokenize")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--label", default="")
    a = p.parse_args()
    if a.make_ids:
        make_ids(a.url, a.ids)
        return
    result = {"label": a.label, **run(a.url, a.model, json.loads(a.ids.read_text()), a.repeats, a.output_len)}
    for name, c in result["cases"].items():  # type: ignore[attr-defined]
        print(f"{a.label} {name}: {c['tok_per_s']:.1f} tok/s ({c['completion_tokens']} tokens)")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
