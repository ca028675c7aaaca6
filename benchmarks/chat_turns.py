"""Multi-turn chats against an OpenAI-compatible server: time to first token per turn, where prefix caching pays.

Each conversation starts with a system prompt (the same one for every conversation with --shared-system, the
case of one deployment's instructions; else its own), then `--turns` user turns; each turn's prompt is the whole
history so far plus a new user message, sent to /v1/completions (raw text, streamed, greedy, ignore_eos, so every
server sees the same text whatever its chat template). Conversations run one after another (one stream, C = 1):
turn 1 of the first conversation is cold; every later prompt starts with text a server has seen. Prints and
writes (--out) the mean TTFT per turn and the whole run's.

    python benchmarks/chat_turns.py --base-url http://127.0.0.1:8000 --model NAME --out result.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import httpx

WORDS = ("river stone light garden window paper market engine silver forest letter winter bridge number "
         "country dinner people history island kitchen morning music ocean picture question reason science "
         "season summer system teacher thought travel village weather animal answer basket bottle butter "
         "candle circle cotton family finger flower friend hammer harbor jacket ladder memory mirror needle").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def stream_ttft(url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """(seconds to the first text, the completion's text). A connection per request, for every server alike
    (llama-server closes a kept-alive connection after a few requests, which a reusing client trips on)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.perf_counter()
    first = None
    text = []
    with httpx.Client(timeout=600) as client, client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = (chunk.get("choices") or [{}])[0].get("text") or ""
            if piece and first is None:
                first = time.perf_counter() - t0
            text.append(piece)
    return (first if first is not None else time.perf_counter() - t0), "".join(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=400)
    p.add_argument("--user-words", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--shared-system", action="store_true", help="one system prompt for every conversation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rng = random.Random(args.seed)
    shared = "System: " + words(rng, args.system_words) + "\n"
    ttft: list[list[float]] = [[] for _ in range(args.turns)]
    for c in range(args.conversations):
        history = shared if args.shared_system else "System: " + words(rng, args.system_words) + "\n"
        for t in range(args.turns):
            history += "User: " + words(rng, args.user_words) + "\nAssistant:"
            secs, answer = stream_ttft(args.base_url, args.model, history, args.max_tokens)
            ttft[t].append(secs)
            history += answer + "\n"
    per_turn = [statistics.mean(x) for x in ttft]
    result = {"label": args.label, "conversations": args.conversations, "turns": args.turns,
              "system_words": args.system_words, "user_words": args.user_words, "max_tokens": args.max_tokens,
              "shared_system": args.shared_system, "ttft_s_by_turn": ttft, "mean_ttft_s_by_turn": per_turn,
              "mean_ttft_s": statistics.mean(s for x in ttft for s in x),
              "mean_ttft_s_turns_after_first": statistics.mean(s for x in ttft[1:] for s in x) if args.turns > 1 else None}
    print(f"{args.label or args.base_url}: mean TTFT by turn (s): " + ", ".join(f"{s:.3f}" for s in per_turn)
          + f"; all turns {result['mean_ttft_s']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
