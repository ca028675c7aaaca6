"""One (37888, 3584) Q4_K layer (the 7B file's gate|up) at 64-256 rows, 2 threads: plain blocks on ggml, repacked on
ggml, repacked read back onto the plain kernel (GGUFLinearMethod._plain), and read back + dequantize + F.linear;
then the read-back path at 1-32 MB scratch tiles (benchmarks/README.md, "bf16 on AVX512_BF16").

    .venv/bin/python benchmarks/experiments/readback_vs_plain.py
"""
import torch, numpy as np, time
from gguf import GGMLQuantizationType as Q
from tokenmill.native import ggml
import tokenmill.layers.ggml_linear as gl
from tokenmill.layers.linear import Linear
from tokenmill.loader.weights import GGUFQuantized
torch.set_num_threads(2)
n,k=37888,3584
w=torch.randn(n,k)*0.05
b=np.empty((n,ggml.row_size(int(Q.Q4_K),k)),dtype=np.uint8); ggml.quantize(int(Q.Q4_K), w.numpy().ctypes.data, b.ctypes.data, n, k)
def mk(rep):
    l=Linear(k,n,gl.GGUFLinearMethod(repack=rep)); l.weight.weight_loader(l.weight,GGUFQuantized(b,Q.Q4_K,(n,k)),None); l.finish_loading(); return l
R,P=mk(True),mk(False)
def t(fn,reps=3):
    fn(); best=9
    for _ in range(reps):
        t0=time.perf_counter(); fn(); best=min(best,time.perf_counter()-t0)
    return best*1e3
for m in (64, 128, 256):
    x=torch.randn(m,k)
    print(m, "plain-weight ggml %.1f"%t(lambda: P.method._ggml(P,x)), "readback %.1f"%t(lambda: R.method._plain(R,x)), "repacked ggml %.1f"%t(lambda: R.method._ggml(R,x)), "dense %.1f"%t(lambda: R.method._dense(R,x)))
print("tile sizes at 128 rows")
x=torch.randn(128,k)
for elems in (1<<18, 1<<19, 1<<20, 1<<21, 1<<22, 1<<23):
    gl._TILE_ELEMS=elems
    print(elems*4>>20, "MB: readback %.1f"%t(lambda: R.method._plain(R,x)))
