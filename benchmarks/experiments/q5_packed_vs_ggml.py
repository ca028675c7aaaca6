"""Q5_0 / Q5_1 / IQ4_NL packed for the 16-bit VNNI kernel (native/vnni_matmul.cpp) against ggml's kernel on the
file's plain blocks (and on ggml's repacked layout, where this CPU has one for the type), y = x . W^T at 1, 4 and 8
rows, over enough copies of one matrix (~96 MB) that each call streams its weights from memory as a decode step
does. Packed Q4_0 / Q8_0 for reference. GB/s of the file's bytes; alternating, best of 4.

    python benchmarks/experiments/q5_packed_vs_ggml.py [SHAPES] [TYPES]   # e.g. 4096x640,1536x640 Q5_0,Q5_1

Needs the VNNI kernels (AVX512-VNNI) and ggml built; run from the repository root (tests/model/gguf_blocks.py
quantizes the random matrices with ggml's quantizer).
"""
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "tests/model")
from gguf_blocks import quantized  # noqa: E402

from tokenmill.native import block_matmul as bm  # noqa: E402
from tokenmill.native import ggml  # noqa: E402


def packed(qtype: int, blocks: np.ndarray, n: int, k: int) -> np.ndarray:
    total = bm.packed_bytes(qtype, n, k)
    buf = np.empty(total + 64, np.uint8)
    out = buf[-buf.ctypes.data % 64:][:total]
    bm.pack(qtype, blocks.ctypes.data, n, k, out.ctypes.data)
    return out


def main() -> None:
    shapes = [tuple(map(int, s.split("x"))) for s in (sys.argv[1] if len(sys.argv) > 1 else "4096x640,1536x640,3584x1024").split(",")]
    types = (sys.argv[2] if len(sys.argv) > 2 else "Q5_0,Q5_1,Q4_0,Q8_0").split(",")
    threads = 2
    for n, k in shapes:
        for t in types:
            qtype, blocks, _ = quantized(t, n, k, seed=1)
            copies = max(2, int(96e6 // blocks.nbytes))
            mats = [blocks.copy() for _ in range(copies)]
            packs = [packed(qtype, b, n, k) for b in mats]
            mms = [ggml.GgmlMatmul([ggml.GgmlWeight(qtype, k, n, b.ctypes.data, False, b)], [0], n) for b in mats]
            rep = [ggml.GgmlWeight(qtype, k, n, b.ctypes.data, True, b) for b in mats]
            reps = [ggml.GgmlMatmul([w], [0], n) for w in rep] if rep[0].repacked else []
            for m in (1, 4, 8):
                x, y = torch.randn(m, k), torch.empty(m, n)

                def ours() -> None:
                    for p in packs:
                        bm.matmul(bm.PACKED | qtype, p.ctypes.data, n, k, x.data_ptr(), m, y.data_ptr(), n, threads)

                def theirs() -> None:
                    for mm in mms:
                        mm(x.data_ptr(), m, y.data_ptr(), threads)

                def repacked() -> None:
                    for mm in reps:
                        mm(x.data_ptr(), m, y.data_ptr(), threads)

                best = {"ours": 1e9, "ggml": 1e9, "repacked": 1e9}
                for _ in range(4):
                    for name, f in (("ours", ours), ("ggml", theirs), ("repacked", repacked)):
                        if name == "repacked" and not reps:
                            continue
                        t0 = time.perf_counter()
                        f()
                        best[name] = min(best[name], time.perf_counter() - t0)
                gb = blocks.nbytes * copies / 1e9
                extra = f", ggml repacked {gb / best['repacked']:5.1f} GB/s" if reps else ""
                print(f"{t} ({n}, {k}) rows {m}: packed {gb / best['ours']:5.1f} GB/s, ggml {gb / best['ggml']:5.1f} GB/s"
                      f"{extra}, packed {min(best['ggml'], best['repacked']) / best['ours']:.2f}x ggml's best speed",
                      flush=True)


if __name__ == "__main__":
    main()
