"""vLLM's n-gram speculation on tokenmill's input-grounded workload (benchmarks/prompts/spec_grounded.json):
each conversation rendered by the model's chat template, alone (C=1), greedy, `--output-len` tokens, off
and on alternating in one process where vLLM allows two engines, else one setting per run. Run it with
the vLLM CPU venv's python (benchmarks/peers/setup_vllm_cpu.sh):

    VLLM_CPU_OMP_THREADS_BIND=0-1 $VPY benchmarks/peers/vllm_spec.py --model HF_DIR --result-json out.json \\
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'

Without --speculative-config it measures speculation off (the baseline to divide by).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

GROUNDED = Path(__file__).resolve().parents[1] / "prompts" / "spec_grounded.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF-format directory (e.g. from `tokenmill convert`)")
    ap.add_argument("--prompts", default=str(GROUNDED))
    ap.add_argument("--speculative-config", default=None)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--result-json", default=None)
    args = ap.parse_args()

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(args.speculative_config) if args.speculative_config else None
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=True, max_model_len=args.max_model_len,
              max_num_seqs=1, speculative_config=spec)
    tok = llm.get_tokenizer()
    convs = json.loads(Path(args.prompts).read_text())
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
    cases = {}
    for name, msgs in convs.items():
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # newer transformers answer a BatchEncoding
            ids = ids["input_ids"]
        prompt = TokensPrompt(prompt_token_ids=list(ids))
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm, cache
        t, n = 0.0, 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)
            t += time.perf_counter() - t0
            n += len(out[0].outputs[0].token_ids)
        cases[name] = {"tok_per_s": n / t, "output_tokens": n // args.repeats, "prompt_tokens": len(ids)}
    text = json.dumps({"server": f"vllm {vllm.__version__} offline", "speculative_config": spec, "cases": cases,
                       "dtype": args.dtype, "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_end": list(os.getloadavg())}, indent=2)
    print(text)
    if args.result_json:
        Path(args.result_json).write_text(text + "\n")


if __name__ == "__main__":
    main()
