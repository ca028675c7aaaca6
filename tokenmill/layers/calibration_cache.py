"""The GGUF method's start-up crossover measurements, kept so that an engine does not time again what an
earlier one measured (ggml_linear.GGUFLinearMethod.calibrate: ~6 s of matmuls on a 2-core CPU).

Always kept for the life of the process: a second engine of the same shapes in one process (the offline
API, a multi-model server) reuses the first one's figures. With TOKENMILL_CALIBRATION_CACHE naming a file
they are also read from and written to it, so that processes share them (the test suite points it at one
file per run, for the servers it starts). The key holds everything a measurement depends on but the
timings (CPU, shapes, types, kernels, threads, TOKENMILL_* settings); a measurement is never refreshed
while its entry exists, so a file kept for long keeps the figures of the moment it was written.

A missing, unreadable or half-written file is taken as empty; writes replace the file atomically.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("tokenmill")

CACHE_ENV = "TOKENMILL_CALIBRATION_CACHE"


@dataclass
class Crossover:
    """What calibrate() decides: the block kernels up to max_ggml_rows rows (the dense path above), the fp32
    panel kernel from panel_min_rows (None: never), ggml's plain-block kernel above the crossover for
    repacked Q4_K (big_plain); figures: the timings behind it, for the log."""

    max_ggml_rows: int
    panel_min_rows: int | None
    big_plain: bool
    figures: list[str] = field(default_factory=list)


class CalibrationCache:
    def __init__(self) -> None:
        self._mem: dict[str, Crossover] = {}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        p = os.environ.get(CACHE_ENV)
        return Path(p) if p else None

    def get(self, key: str) -> tuple[Crossover, str] | None:
        """The crossover stored under key and where it came from (for the log), or None."""
        with self._lock:
            if key in self._mem:
                return self._mem[key], "measured earlier in this process"
            path = self.path
            if path is None:
                return None
            entry = self._read(path).get(key)
            if entry is None:
                return None
            try:
                found = Crossover(**entry)
            except TypeError:  # written by another version
                return None
            self._mem[key] = found
            return found, f"read from {path}"

    def put(self, key: str, crossover: Crossover) -> None:
        with self._lock:
            self._mem[key] = crossover
            path = self.path
            if path is None:
                return
            entries = self._read(path)
            entries[key] = asdict(crossover)
            tmp = None
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(entries, f)
                os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
            except OSError as e:
                log.warning("could not write the calibration cache %s: %s", path, e)
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> dict[str, dict]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


CALIBRATIONS = CalibrationCache()
