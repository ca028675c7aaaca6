"""The tiny random HF models of tests/model/test_granite_hybrid.py ("moe", "dense") and test_lfm2_moe.py, saved
under OUT/<name>/hf for llama.cpp's converter. Usage: make_hf.py OUT"""
import json
import sys
from pathlib import Path
sys.path.insert(0, "/work/main/tests/model")
import test_granite_hybrid as G
import test_lfm2_moe as L

out = Path(sys.argv[1])
for name in ("moe", "dense"):
    # the dense one as released (H-Micro: num_local_experts 0 and num_experts_per_tok 0); the test's dense variant
    # keeps BASE's num_experts_per_tok 2, which llama.cpp's converter writes as expert_used_count 2 beside
    # expert_count 0, and llama-server aborts on (GGML_ASSERT(n_expert_used_max <= hparams.n_expert))
    config = {**G.VARIANTS[name], **({"num_experts_per_tok": 0} if name == "dense" else {})}
    G.make_hf(out / f"granite-{name}" / "hf", config)
    # transformers 5 saves layer_types as linear_attention / full_attention; the released configs (and llama.cpp's
    # converter, GraniteHybridModel.get_attn_layers: typ == "attention") use mamba / attention. With the former the
    # converter writes head_count_kv all 0 (every layer Mamba2) and the file loads in neither llama.cpp nor tokenmill.
    cfg_path = out / f"granite-{name}" / "hf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["layer_types"] = ["attention" if t == "full_attention" else "mamba" for t in cfg["layer_types"]]
    cfg_path.write_text(json.dumps(cfg, indent=2))
L.make_hf(out / "lfm2moe" / "hf")
print("ok")
