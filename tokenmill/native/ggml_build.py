"""libggml (the CPU backend only) built from a pinned PyPI sdist that vendors it, plus tokenmill's shim over it.

    python -m tokenmill.native.build      (what `make install` runs)

1. `pip download llama-cpp-python==SDIST_VERSION --no-binary :all: --no-deps` into the cache (PyPI, at
   install time only: at run time nothing is downloaded; a missing build means the torch path, and the log
   says so). Only its vendored `vendor/llama.cpp/ggml/` is unpacked and built; nothing of llama.cpp or of
   the Python package is used.
2. cmake builds that ggml with -march=native (GGML_NATIVE), OpenMP and no other backend, into a directory
   keyed by the CPU flags (a cache copied to another CPU rebuilds, never dies on an illegal instruction);
   TOKENMILL_NATIVE_ISA=avx2 builds it for AVX2 instead (compile.py);
3. g++ builds ggml_shim.cpp against those headers and libraries (compile.build_library).

Why this sdist and not ggml-python's: ggml-python 0.0.45 (the newest on PyPI) vendors ggml 0.15.3, whose
K-quant matmul is one row-by-column dot product at a time; llama-cpp-python 0.3.36 vendors ggml 0.25.3,
which multiplies K- and IQ-quant blocks in tiles once a batch has rows enough (ggml-cpu/tiled/): a
(18944, 3584) Q4_K matrix at 128 rows runs at 218 GFLOPS on plain blocks against 50, and a 7B file's prompt
at 15 tokens/s against 8 (benchmarks/README.md). The cost: that tiled kernel is not row-independent, so
batched == alone holds only approximately (~1e-5 relative) for plain K-quant blocks (tests state it).

ggml makes no ABI promise, so the version is pinned and the shim is compiled against its own headers.
MIT licence (ggml, llama.cpp and llama-cpp-python).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tokenmill.native.compile import (MISSING_TOOLS_HINT, NativeBuildError, build_key, build_library, cache_dir,
                                      target_isa)

log = logging.getLogger("tokenmill.native")

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
GGML_VERSION = "0.25.3"  # what SDIST_VERSION vendors
SDIST = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
_GGML_DIR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/ggml/"  # the part of the sdist that is built
_HERE = Path(__file__).parent


@dataclass(frozen=True)
class GgmlBuild:
    include_dir: Path
    lib_dir: Path

    @property
    def libraries(self) -> list[Path]:
        return [self.lib_dir / f"lib{n}.so" for n in ("ggml-base", "ggml-cpu", "ggml")]


def _ggml_root() -> Path:
    return cache_dir() / "ggml"


def _sdist(download: bool) -> Path:
    path = _ggml_root() / SDIST
    if path.exists():
        return path
    if not download:
        raise NativeBuildError(f"ggml is not built here (no {SDIST} in {_ggml_root()}); run "
                               "`python -m tokenmill.native.build` (make install does)")
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", f"{SDIST_PACKAGE}=={SDIST_VERSION}",
           "--no-binary", ":all:", "--no-deps", "-d", str(path.parent)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not path.exists():
        raise NativeBuildError(f"could not download the {SDIST_PACKAGE} sdist:\n{' '.join(cmd)}\n{res.stderr[-2000:]}")
    return path


def ggml_build(download: bool = False) -> GgmlBuild:
    """The cached build for this CPU, building it (from a cached or downloaded sdist) if needed."""
    isa = target_isa()
    key = build_key("ggml", GGML_VERSION, SDIST_VERSION, *([] if isa == "native" else [isa]))
    out = _ggml_root() / f"build-{key}"
    build = GgmlBuild(out / "include", out / "lib")
    if all(p.exists() for p in build.libraries):
        return build
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise NativeBuildError(f"building ggml needs {tool}, which is not installed. {MISSING_TOOLS_HINT}")
    from tokenmill.native.compile import _Lock

    with _Lock(_ggml_root() / ".build.lock"):
        if all(p.exists() for p in build.libraries):
            return build
        sdist = _sdist(download)
        src = out / "src"
        shutil.rmtree(out, ignore_errors=True)
        src.mkdir(parents=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(src, members=[m for m in tf.getmembers() if m.name.startswith(_GGML_DIR)], filter="data")
        ggml_src = src / _GGML_DIR
        # ggml's CMakeLists configures a pkg-config file from ggml.pc.in, which the sdist leaves out; an empty
        # template gives an empty ggml.pc, which nothing here reads
        (ggml_src / "ggml.pc.in").touch()
        bdir = out / "cmake"
        target = (["-DGGML_NATIVE=ON"] if isa == "native" else  # avx2: what compile.ISA_ENV says
                  ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                   "-DGGML_BMI2=ON"])
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", *target, "-DGGML_OPENMP=ON",
                 "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", "-DGGML_METAL=OFF", "-DGGML_CUDA=OFF",
                 "-DGGML_VULKAN=OFF", "-DGGML_BLAS=OFF", f"-DCMAKE_INSTALL_PREFIX={out}",
                 "-DCMAKE_INSTALL_LIBDIR=lib", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]
        jobs = str(max(1, os.cpu_count() or 1))
        log.info("building ggml %s (from the %s %s sdist) for this CPU (about two minutes)", GGML_VERSION,
                 SDIST_PACKAGE, SDIST_VERSION)
        for cmd in (["cmake", "-S", str(ggml_src), "-B", str(bdir), *flags],
                    ["cmake", "--build", str(bdir), "-j", jobs],
                    ["cmake", "--install", str(bdir)]):
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise NativeBuildError(f"building ggml failed:\n{' '.join(cmd)}\n{res.stdout[-2000:]}\n"
                                       f"{res.stderr[-2000:]}")
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(bdir, ignore_errors=True)
    if not all(p.exists() for p in build.libraries):
        raise NativeBuildError(f"ggml built, but {build.libraries} are not all there")
    return build


def shim_library(download: bool = False) -> Path:
    """libtokenmill_ggml.so: ggml_shim.cpp linked against this CPU's ggml build."""
    b = ggml_build(download)
    return build_library("tokenmill_ggml", [_HERE / "ggml_shim.cpp"],
                         flags=[f"-I{b.include_dir}", "-fopenmp"],
                         link=[f"-L{b.lib_dir}", "-lggml", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{b.lib_dir}"])
