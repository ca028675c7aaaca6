"""Build small native libraries with the system's g++ and cache them, keyed by what decides the binary.

A library is compiled once per (sources, flags, compiler, CPU flags) and kept under the cache directory
(`$TOKENMILL_CACHE_DIR`, default ~/.cache/tokenmill) in `native/<name>-<key>/`. The CPU flags are part of
the key because libraries are built with -march=native: a cache copied to another machine rebuilds
instead of dying on an illegal instruction. Concurrent builders (test processes) take a file lock.

TOKENMILL_NATIVE_ISA=avx2 builds every native library, ggml included, for an AVX2-only CPU (x86-64-v3:
AVX2, FMA, F16C, BMI2; no AVX-512, no AMX) instead of this one: what benchmarks use to measure, on an
AVX-512 host, the code that AMD Zen 2/3 CPUs run (beside a llama-server built the same way). A proxy for
the code, not for those CPUs' speed. Unset or `native`: -march=native.

No torch here: `tokenmill plan` and the build step at install use it too.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


log = logging.getLogger("tokenmill.native")

MISSING_TOOLS_HINT = ("tokenmill's native kernels need g++ (and cmake for ggml) from the system: on Debian "
                      "or Ubuntu `apt-get install g++ cmake`")


class NativeBuildError(RuntimeError):
    pass


ISA_ENV = "TOKENMILL_NATIVE_ISA"
ISAS = ("native", "avx2")


def target_isa() -> str:
    """What the native libraries are built for: `native` (this CPU) or `avx2` (ISA_ENV)."""
    isa = os.environ.get(ISA_ENV) or "native"
    if isa not in ISAS:
        raise NativeBuildError(f"{ISA_ENV} is one of {', '.join(ISAS)}, not {isa!r}")
    return isa


def march_flags() -> list[str]:
    """g++'s target flags for target_isa()."""
    return ["-march=native"] if target_isa() == "native" else ["-march=x86-64-v3", "-mtune=native"]


def cache_dir() -> Path:
    return Path(os.environ.get("TOKENMILL_CACHE_DIR") or Path.home() / ".cache" / "tokenmill")


@functools.cache
def compiler_version(cxx: str = "g++") -> str | None:
    """`g++ --version`'s first line, or None when there is no such compiler."""
    if shutil.which(cxx) is None:
        return None
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0] if out.stdout else None


@functools.cache
def _host_flags() -> str:
    """The CPU flags from /proc/cpuinfo, read here (not through cpu_features, which tests monkeypatch to
    pretend another CPU: the binary must match the real one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def build_key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    h.update(_host_flags().encode())
    return h.hexdigest()[:16]


class _Lock:
    """An exclusive flock on `path` for the duration of a with-block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> _Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def build_library(name: str, sources: Sequence[Path], flags: Sequence[str] = (), link: Sequence[str] = (),
                  cxx: str = "g++") -> Path:
    """Compile `sources` into lib<name>.so (cached) and return its path. Raises NativeBuildError with the
    compiler's output (or the missing-tools hint) when it cannot."""
    version = compiler_version(cxx)
    if version is None:
        raise NativeBuildError(f"no C++ compiler ({cxx}) found. {MISSING_TOOLS_HINT}")
    cmd_flags = ["-O3", *march_flags(), "-shared", "-fPIC", "-std=c++17", *flags]
    key = build_key(name, version, *cmd_flags, *link, *(Path(s).read_bytes() for s in sources))
    out_dir = cache_dir() / "native" / f"{name}-{key}"
    lib = out_dir / f"lib{name}.so"
    if lib.exists():
        return lib
    with _Lock(cache_dir() / "native" / f".{name}.lock"):
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".lib{name}.so.{os.getpid()}"
        cmd = [cxx, *cmd_flags, *map(str, sources), "-o", str(tmp), *link]
        log.info("building %s: %s", name, " ".join(cmd))
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise NativeBuildError(f"building {name} failed:\n{' '.join(cmd)}\n{res.stderr[-4000:]}")
        tmp.rename(lib)
    return lib
