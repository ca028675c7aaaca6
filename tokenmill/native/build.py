"""`python -m tokenmill.native.build`: build (or find cached) every native library for this CPU.

`make install` runs it, so serving and tests never wait for a compiler; a library that cannot be built
is reported and its torch fallback is used at run time. Exit status 0 even then, unless --strict.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tokenmill.native.compile import NativeBuildError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenmill.native.build", description=__doc__)
    p.add_argument("--strict", action="store_true", help="exit 1 if any library cannot be built")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tokenmill.native.ggml_build import shim_library

    failed = False
    try:
        print(f"tokenmill native: ggml shim at {shim_library(download=True)}")
    except NativeBuildError as e:
        failed = True
        print(f"tokenmill native: ggml is not available, GGUF weights will be dequantized: {e}", file=sys.stderr)
    from tokenmill.native import block_matmul, decode_step, kernels
    from tokenmill.native.compile import build_library

    # (what, library name, module with SOURCE (or SOURCES) and FLAGS, what runs without it)
    for what, name, mod, fallback in (
            ("kernels", "tokenmill_kernels", kernels, "the torch path will run"),
            ("block matmul", "tokenmill_block_matmul", block_matmul, "ggml's kernels will run"),
            ("decode step", "tokenmill_decode_step", decode_step, "layers will run one by one")):
        try:
            print(f"tokenmill native: {what} at {build_library(name, getattr(mod, 'SOURCES', [mod.SOURCE]), mod.FLAGS)}")
        except NativeBuildError as e:
            failed = True
            print(f"tokenmill native: {what} not built, {fallback}: {e}", file=sys.stderr)
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
