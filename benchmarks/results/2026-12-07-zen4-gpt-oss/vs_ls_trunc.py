import sys, runpy
from dataclasses import replace
from tokenmill.loader import model_config as mc
orig = mc.ModelConfig.from_gguf.__func__
def patched(cls, *a, **k):
    cfg = orig(cls, *a, **k)
    if cfg.rope_scaling: cfg = replace(cfg, rope_scaling={**cfg.rope_scaling, "truncate": True})
    print("rope", cfg.rope_scaling, file=sys.stderr)
    return cfg
mc.ModelConfig.from_gguf = classmethod(patched)
runpy.run_path("/tmp/go/vs_ls.py", run_name="__main__")
