"""What a newer ggml would give: libggml built from llama-cpp-python's sdist (its vendored llama.cpp ggml,
0.25.x, with the tiled K-quant matmul) instead of ggml-python's (ggml 0.15.x), the shim compiled against
it, then the same probe on both: one (18944, 3584) Q4_K matrix at 1-256 rows, plain blocks and repacked,
2 threads; and, with --latency MODEL, `tokenmill bench latency` on MODEL with the newer library.

    python benchmarks/experiments/ggml_newer.py SDIST.tar.gz [--latency MODEL.gguf]

SDIST: llama_cpp_python-<version>.tar.gz (`pip download llama-cpp-python --no-binary :all: --no-deps`;
benchmarks/peers/build_llama_server.sh caches one under ~/.cache/tokenmill/llama-server/src).
"""
import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("sdist")
ap.add_argument("--latency")
ap.add_argument("--out", default="/tmp/tokenmill-ggml-newer")
args = ap.parse_args()
out = Path(args.out)
lib_dir = out / "lib"
if not (lib_dir / "libggml.so").exists():
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.sdist) as tf:
        tf.extractall(src, filter="data")
    ggml_src = next(src.glob("llama_cpp_python-*/vendor/llama.cpp/ggml"))
    (ggml_src / "ggml.pc.in").touch()  # the sdist leaves out the pkg-config template its CMakeLists reads
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DGGML_OPENMP=ON",
             "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", f"-DCMAKE_INSTALL_PREFIX={out}",
             "-DCMAKE_INSTALL_LIBDIR=lib", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]
    for cmd in (["cmake", "-S", str(ggml_src), "-B", str(out / "cmake"), *flags],
                ["cmake", "--build", str(out / "cmake"), "-j", str(os.cpu_count())],
                ["cmake", "--install", str(out / "cmake")]):
        subprocess.run(cmd, check=True, capture_output=True)
from tokenmill.native import ggml_build
from tokenmill.native.compile import build_library

shim = build_library("tokenmill_ggml_newer", [Path(ggml_build.__file__).with_name("ggml_shim.cpp")],
                     flags=[f"-I{out / 'include'}", "-fopenmp"],
                     link=[f"-L{lib_dir}", "-lggml", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{lib_dir}"])
if os.environ.get("OLD") != "1":
    ggml_build.shim_library = lambda download=False: shim  # what tokenmill.native.ggml loads
import torch  # noqa: E402

from tokenmill.layers.ggml_linear import to_blocks  # noqa: E402
from tokenmill.native import ggml  # noqa: E402

print("shim:", ggml.lib()._name)
if args.latency:
    from tokenmill.cli import main

    sys.exit(main(["bench", "latency", "--model", args.latency, "--input-len", "128", "--output-len", "8",
                   "--max-model-len", "1024"]))
torch.manual_seed(0)
N, K = 18944, 3584
b = to_blocks(torch.randn(N, K) * 0.02, "q4_k")
for repack in (False, True):
    gw = ggml.GgmlWeight(12, K, N, b.data.ctypes.data, repack, b)
    mm = ggml.GgmlMatmul([gw], [0], N)
    for m in (1, 16, 64, 128, 256):
        x, y = torch.randn(m, K), torch.empty(m, N)
        mm(x.data_ptr(), m, y.data_ptr(), 2)
        times = []
        for _ in range(3):
            s = time.perf_counter()
            mm(x.data_ptr(), m, y.data_ptr(), 2)
            times.append(time.perf_counter() - s)
        t = min(times)
        print(f"layout {gw.layout!r} M={m}: {t * 1e3:.1f} ms, {2 * N * K * m / t / 1e9:.0f} GFLOPS")
