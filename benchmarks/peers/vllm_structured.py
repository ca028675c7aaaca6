"""vLLM's structured output on the workload `tokenmill bench structured --save-workload W.json` ran: the
same prompts (token ids) and JSON schemas, C at a time, constrained, then the same requests unconstrained
with max_tokens set to each one's constrained length and ignore_eos (the same token counts). Run it with
the vLLM CPU venv's python (benchmarks/peers/setup_vllm_cpu.sh):

    VLLM_CPU_OMP_THREADS_BIND=0-1 $VPY benchmarks/peers/vllm_structured.py --model HF_DIR --workload W.json \\
        --backend guidance --result-json out.json

--backend: vLLM's structured-output backend (guidance = llguidance, as tokenmill uses; xgrammar; auto).
max_num_seqs is set to the workload's concurrency, as tokenmill's run had it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF-format directory (e.g. from `tokenmill convert`)")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--backend", default="guidance")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--result-json", default=None)
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    with open(args.workload) as f:
        w = json.load(f)
    C, reqs = w["concurrency"], w["requests"]
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=True, max_model_len=args.max_model_len,
              max_num_seqs=C, structured_outputs_config={"backend": args.backend})
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in reqs]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)  # warm, and cache prompts
    rounds = []
    for r in range(w["rounds"]):
        sl = slice(r * C, (r + 1) * C)
        cparams = [SamplingParams(temperature=w["temperature"], seed=w["seed"] + i, max_tokens=w["max_tokens"],
                                  structured_outputs=StructuredOutputsParams(json=q["schema"]))
                   for i, q in enumerate(reqs[sl])]
        t0 = time.perf_counter()
        outs = llm.generate(prompts[sl], cparams, use_tqdm=False)
        constrained_s = time.perf_counter() - t0
        lens = [len(o.outputs[0].token_ids) for o in outs]
        valid = 0
        for o in outs:
            try:
                json.loads(o.outputs[0].text)
                valid += 1
            except ValueError:
                pass
        fparams = [SamplingParams(temperature=w["temperature"], seed=w["seed"] + i, max_tokens=n, ignore_eos=True)
                   for i, n in enumerate(lens)]
        t0 = time.perf_counter()
        llm.generate(prompts[sl], fparams, use_tqdm=False)
        free_s = time.perf_counter() - t0
        rounds.append({"tokens": sum(lens), "constrained_s": constrained_s, "free_s": free_s,
                       "ratio": free_s / constrained_s, "parsed": valid})
    import vllm

    tok = sum(x["tokens"] for x in rounds)
    rec = {"server": f"vllm {vllm.__version__} offline, structured outputs backend {args.backend}",
           "dtype": args.dtype, "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "concurrency": C,
           "output_tokens": tok, "constrained_tok_per_s": tok / sum(x["constrained_s"] for x in rounds),
           "free_tok_per_s": tok / sum(x["free_s"] for x in rounds),
           "ratio_median": statistics.median(x["ratio"] for x in rounds), "per_round": rounds,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_end": list(os.getloadavg())}
    print(json.dumps(rec, indent=2))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(rec, f, indent=2)


if __name__ == "__main__":
    main()
