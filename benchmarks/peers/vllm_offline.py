"""vLLM's offline API (`vllm.LLM.generate`) on prompts saved by `tokenmill bench throughput --save-prompts`,
for the offline side-by-side in benchmarks/offline_compare.sh. Run it with the vLLM CPU venv's python:

    VLLM_CPU_OMP_THREADS_BIND=0-1 $VPY benchmarks/peers/vllm_offline.py --model HF_DIR --prompts P.json \\
        --output-len 128 --dtype float32 --result-json out.json

Greedy, ignore_eos, so every request yields exactly --output-len tokens; vLLM's own scheduler defaults
(it is measured at its defaults, as tokenmill is at its own). One untimed warm-up call first.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF-format directory (e.g. from `tokenmill convert`)")
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--result-json", default=None)
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.prompts) as f:
        prompts = json.load(f)
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=True, max_model_len=args.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=p[:16]) for p in prompts[:2]],
                 SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    n_in = sum(len(p) for p in prompts)
    import vllm

    rec = {"server": f"vllm {vllm.__version__} offline (LLM.generate)", "dtype": args.dtype,
           "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "num_prompts": len(prompts),
           "input_len_mean": n_in / len(prompts), "output_len": args.output_len, "seconds": dt,
           "requests_per_s": len(prompts) / dt, "output_tok_per_s": n_out / dt, "total_tok_per_s": (n_out + n_in) / dt,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_end": list(os.getloadavg())}
    print(json.dumps(rec, indent=2))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(rec, f, indent=2)


if __name__ == "__main__":
    main()
