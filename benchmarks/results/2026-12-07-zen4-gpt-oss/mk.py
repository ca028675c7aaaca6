import sys; sys.path.insert(0, "tests/model"); sys.path.insert(0, "tests")
from pathlib import Path
import test_gpt_oss as t
tmp = Path("/tmp/go/tiny"); tmp.mkdir(exist_ok=True)
m = t.make_hf(tmp / "hf")
for q in ("F32", "MXFP4"):
    t.write_gguf(tmp / f"{q}.gguf", m, q)
t.write_gguf(tmp / "Q8_0.gguf", m, "Q8_0")
