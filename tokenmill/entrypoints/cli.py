"""Compatibility shim: the command moved to `tokenmill.cli`, the top of the layers.

`python -m tokenmill.entrypoints.cli ...` still runs it (scripts and tests start servers that way), and
`main` / `build_parser` are still reachable from here, looked up when asked for so that nothing in the
package imports the top layer. New code uses `tokenmill.cli`.
"""

from __future__ import annotations

import importlib
import runpy
from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("main", "build_parser"):
        return getattr(importlib.import_module("tokenmill.cli"), name)
    raise AttributeError(name)


if __name__ == "__main__":
    runpy.run_module("tokenmill.cli", run_name="__main__", alter_sys=True)
