"""Draft-length policies for n-gram speculation, compared by replay (no timing): which drafts a policy would
send at each step of a greedy answer, and what that costs at a given row cost (benchmarks/spec_ceiling.py's
model: a step verifying k drafts costs 1 + row_cost * k one-row steps).

    .venv/bin/python benchmarks/experiments/spec_policy_replay.py [--row-costs 0.3] [--cache /tmp/spec_answers.json]

Prompts: the bench's two grounded ones (tokenmill/benchmarks/prompts/spec_grounded.json) and held-out ones
written here (other documents and edits), so that a policy is not tuned to the bench's two. Each prompt's
greedy answer is generated once and cached (--cache).

Policies:
  oracle        each step drafts exactly the drafts that will be accepted (the ceiling for these drafts)
  adaptive      the engine's rule: best_draft_length over one decayed acceptance estimate per request
  by_match      the same, with one estimate per class of match: how far the match behind the drafts
                reaches back (the common suffix of the sequence and the text before the drafts' source,
                past the n-gram itself), in classes 2-3 / 4-7 / 8-15 / 16+ tokens. A long match is a
                verbatim copy under way; a short one is a coincidence of a few tokens
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tokenmill.engine.spec_decode import _DECAY, _PRIOR_ACCEPTED, _PRIOR_REJECTED  # noqa: E402
from tokenmill.engine.step_cost import best_draft_length  # noqa: E402

CODE = '''import csv
from dataclasses import dataclass


@dataclass
class Record:
    name: str
    city: str
    amount: float


def parse_line(line: str) -> Record:
    name, city, amount = line.strip().split(",")
    return Record(name.strip(), city.strip(), float(amount))


def load(path: str) -> list[Record]:
    with open(path) as f:
        return [parse_line(line) for line in f if line.strip()]


def total_by_city(records: list[Record]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in records:
        totals[r.city] = totals.get(r.city, 0.0) + r.amount
    return totals


def main(path: str) -> None:
    records = load(path)
    for city, total in sorted(total_by_city(records).items()):
        print(f"{city}: {total:.2f}")
'''

DOC = ("The village of Arnhale stands on a low hill above the marshes. Its church was begun in 1312 and "
       "finished in 1340, after the builders had twice run out of money. The tower fell in a storm in 1703 and "
       "was rebuilt in brick, which is why it does not match the stone of the nave. In 1851 the railway reached "
       "the next town, and Arnhale lost half of its people within thirty years. The school closed in 1968. "
       "Since 1995 the old school has been a museum of marsh life, open on Saturdays from April to October. "
       "The museum keeps a boat that was found in the marsh in 1987 and is thought to be more than a thousand "
       "years old.")

HELD_OUT = {
    "rename": [{"role": "user", "content": "Rename the function parse_line to parse_record everywhere in this "
                "file and give the whole file back.\n\n" + CODE}],
    "doc_answer": [{"role": "user", "content": DOC + "\n\nUsing sentences copied from the text, say what "
                    "happened to Arnhale's tower and to its school."}],
    "dates": [{"role": "user", "content": DOC + "\n\nList every year mentioned in the text, each with the "
               "sentence it appears in."}],
    "numbered": [{"role": "user", "content": "Turn this into a numbered list, keeping each item's words:\n"
                  "- check the oil level before every long drive\n- keep the tyres at the pressure on the door "
                  "label\n- replace the wiper blades every autumn\n- carry a torch and a blanket in winter\n"
                  "- write down the mileage at each service\n- clean the battery terminals twice a year"}],
    "json_yaml": [{"role": "user", "content": "Convert this JSON to YAML:\n" + json.dumps(
        {"server": {"host": "127.0.0.1", "port": 8000, "workers": 2},
         "model": {"path": "/models/small.gguf", "context": 4096, "dtype": "bfloat16"},
         "logging": {"level": "info", "file": "/var/log/server.log"}}, indent=2)}],
    "typos": [{"role": "user", "content": "Fix the spelling mistakes in this paragraph and give it back:\n"
               "The comittee met on Tuesday to discus the new libary. Most members agreed that the bulding "
               "should be finished befor the winter, but the tresurer warned that the budjet was alredy "
               "spent. After a long argument they desided to ask the town for more mony."}],
}


def match_info(text: str, k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """engine/ngram_proposer.propose's drafts, and how far the match behind them reaches back (tokens of
    common suffix of text and text[:source], capped at 64)."""
    L = len(text)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = text[L - n:]
        j = text.rfind(suffix, 0, L - 1)
        if j != -1:
            follow = text[j + n: j + n + k]
            if follow:
                back = n
                while back < 64 and j + n - back - 1 >= 0 and text[j + n - back - 1] == text[L - back - 1] \
                        and j + n - back - 1 != L - back - 1:
                    back += 1
                return [ord(c) for c in follow], back
    return [], 0


def runs_of(prompt: list[int], output: list[int], k: int, min_n: int, max_n: int) -> list[tuple[int, int, int]]:
    """Per output position t: (drafts offered, accepted, match length behind them)."""
    out = []
    for t in range(len(output)):
        drafts, back = match_info("".join(map(chr, prompt + output[:t])), k, min_n, max_n)
        a = 0
        while a < len(drafts) and t + a < len(output) and drafts[a] == output[t + a]:
            a += 1
        out.append((len(drafts), a, back))
    return out


def match_class(back: int) -> int:
    return 0 if back < 4 else 1 if back < 8 else 2 if back < 16 else 3


def replay(runs: list[tuple[int, int, int]], row_cost: float, policy: str, k_max: int) -> tuple[float, float]:
    """(speed-up over plain decoding, share of drafted tokens accepted)."""
    T, t, cost, drafted, kept_all = len(runs), 0, 0.0, 0, 0
    est = {c: [_PRIOR_ACCEPTED, _PRIOR_REJECTED] for c in range(4)}
    one = [_PRIOR_ACCEPTED, _PRIOR_REJECTED]
    while t < T:
        offered, good, back = runs[t]
        if policy == "oracle":
            k = good
        else:
            e = one if policy == "adaptive" else est[match_class(back)]
            k = best_draft_length(e[0] / (e[0] + e[1]), row_cost, k_max) if offered else 0
        k = min(k, offered, T - t - 1)
        kept = min(good, k)
        cost += 1.0 + row_cost * k
        drafted += k
        kept_all += kept
        if k and policy != "oracle":
            e = one if policy == "adaptive" else est[match_class(back)]
            e[0], e[1] = _DECAY * e[0] + kept, _DECAY * e[1] + (kept < k)
        t += kept + 1
    return T / cost, kept_all / max(drafted, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row-costs", default="0.15,0.3")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--cache", default="/tmp/spec_answers.json")
    args = ap.parse_args()
    from tokenmill.benchmarks.spec import GROUNDED
    from tokenmill.config import SpeculativeConfig

    cfg = SpeculativeConfig(method="ngram")
    cache = Path(args.cache)
    if cache.exists():
        answers = json.loads(cache.read_text())
    else:
        from tokenmill.entrypoints.llm import LLM
        from tokenmill.sampling_params import SamplingParams

        llm = LLM(progress=False)
        proc = llm.engine.input_processor
        answers = {}
        for name, msgs in {**json.loads(GROUNDED.read_text()), **HELD_OUT}.items():
            prompt = proc.render_chat_ids(msgs, True)
            out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=args.output_len), use_tqdm=False)
            answers[name] = [prompt, list(out[0].outputs[0].token_ids)]
            print(name, repr(llm.tokenizer.decode(answers[name][1])[:300]))
        cache.write_text(json.dumps(answers))
    by_class: dict[int, list[int]] = {c: [0, 0, 0] for c in range(4)}  # positions, first draft right, accepted
    for prompt, output in answers.values():
        for offered, good, back in runs_of(prompt, output, args.k, cfg.prompt_lookup_min, cfg.prompt_lookup_max):
            if offered:
                c = by_class[match_class(back)]
                c[0], c[1], c[2] = c[0] + 1, c[1] + (good > 0), c[2] + good
    print("every position with a draft, by how far its match reaches back:")
    for c, name in enumerate(("2-3", "4-7", "8-15", "16+")):
        n, first, acc = by_class[c]
        print(f"  {name:>5} tokens: {n:4d} positions, first draft right {first / max(n, 1):.2f}, "
              f"drafts accepted {acc / max(n, 1):.2f} of up to {args.k}")
    policies = ("oracle", "adaptive", "by_match")
    for rc in (float(x) for x in args.row_costs.split(",")):
        print(f"row cost {rc}: speed-up (accepted share) per policy")
        for name, (prompt, output) in answers.items():
            runs = runs_of(prompt, output, args.k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            cells = [replay(runs, rc, p, args.k) for p in policies]
            print(f"  {name:18s} " + "  ".join(f"{p} {s:.2f} ({a:.0%})" for p, (s, a) in zip(policies, cells)))


if __name__ == "__main__":
    main()
