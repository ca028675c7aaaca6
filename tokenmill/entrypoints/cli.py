"""Compatibility shim: the command moved to `tokenmill.cli` (the top layer, so nothing imports upward).

`python -m tokenmill.entrypoints.cli ...` still works (scripts and tests start servers that way), and
`main` / `build_parser` are still importable from here. New code uses `tokenmill.cli`.
"""

from __future__ import annotations

import sys

from tokenmill.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
