"""lm-evaluation-harness (PyPI lm_eval) pointed at `tokenmill serve` through its `local-completions` model:
a loglikelihood (multiple-choice) task and a generation task run end to end, from task files written here
(nothing downloaded), and the harness's loglikelihoods equal those of tokenmill's offline API."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import API_KEY
from server_process import ServerProcess

lm_eval = pytest.importorskip("lm_eval")

CHOICE_DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " a banana"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven"], "answer": 0},
    {"question": "The opposite of hot is", "choices": [" cold", " purple", " running"], "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": [" Celsius", " Fahrenheit"], "answer": 0},
]
GEN_DOCS = [
    {"question": "Q: What is the capital of France?\nA:", "answer": " Paris"},
    {"question": "Q: How many legs does a dog have?\nA:", "answer": " Four"},
]


def write_tasks(root: Path) -> Path:
    (root / "choice.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CHOICE_DOCS))
    (root / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    (root / "tm_choice.yaml").write_text(f"""task: tm_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / 'choice.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (root / "tm_gen.yaml").write_text(f"""task: tm_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
""")
    return root


def write_hf_tokenizer(root: Path, model_path: str) -> Path:
    """The default model's tokenizer as an HF directory (what the harness tokenizes with)."""
    from tokenmill.entrypoints.convert import hf_tokenizer_files
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.tokenizer.tokenizer import Tokenizer

    gf = GGUFFile(model_path)
    md = dict(gf.metadata)
    gf.close()
    tok_json, tok_config = hf_tokenizer_files(Tokenizer.from_gguf(md), md, 2048)
    out = root / "tokenizer"
    out.mkdir()
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return out


def test_lm_eval_local_completions_end_to_end(server: ServerProcess, llm, default_model_path: str,
                                              tmp_path: Path, monkeypatch) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from tokenmill import SamplingParams

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    tasks = write_tasks(tmp_path)
    tokenizer = write_hf_tokenizer(tmp_path, default_model_path)
    model = "SmolLM2-135M-Instruct"
    results = simple_evaluate(
        model="local-completions",
        model_args={"model": model, "base_url": f"{server.url}/v1/completions", "tokenizer": str(tokenizer),
                    "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": 1,
                    "max_retries": 1, "header": {"Authorization": f"Bearer {API_KEY}"}},
        tasks=["tm_choice", "tm_gen"], task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
        num_fewshot=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    assert results is not None
    acc = results["results"]["tm_choice"]["acc,none"]
    assert 0.0 <= acc <= 1.0
    assert "exact_match,none" in results["results"]["tm_gen"]
    gens = [s["resps"][0][0] for s in results["samples"]["tm_gen"]]
    assert len(gens) == len(GEN_DOCS) and all(isinstance(g, str) and "\n" not in g for g in gens)

    # every loglikelihood the harness got equals the offline API's, on the same token ids
    tok = llm.tokenizer
    checked = 0
    for sample in results["samples"]["tm_choice"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ll_server = float(resp[0][0])
            if context.endswith(" "):  # the harness moves a context's trailing space into the continuation
                context, continuation = context[:-1], " " + continuation
            ctx = tok.encode(context, add_special_tokens=False)  # the harness adds no BOS for API models
            whole = tok.encode(context + continuation, add_special_tokens=False)
            assert whole[: len(ctx)] == ctx
            out = llm.generate([whole], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
            ll_offline = sum(e.logprob for e in out.prompt_logprobs[len(ctx):])
            assert abs(ll_server - ll_offline) < 1e-3, (context, continuation, ll_server, ll_offline)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in CHOICE_DOCS)

