"""A fast GGUF reader: header and metadata by direct struct parsing over an mmap.

gguf's own `GGUFReader` spends seconds building numpy views for every vocabulary string; this parses the
same header in a fraction of a second and leaves tensor data in the mmap until it is asked for. Tensor
types, block sizes and dequantisation come from the `gguf` package.

Layout (little-endian):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
A GGUF shape lists the fastest-varying dimension first; `TensorInfo.shape` is reversed into PyTorch order,
so a linear weight is (out_features, in_features).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from tokenmill.compute import Matrix

_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY: dict[int, str] = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # PyTorch order (GGUF dims reversed)
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    num_bytes: int


class GGUFFile:
    """Metadata and lazily dequantised tensors of one .gguf file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise GGUFError(f"{self.path} is empty, not a GGUF file")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 4  # past the magic
        if self._mm[:4] != b"GGUF":
            raise GGUFError(f"{self.path} is not a GGUF file (bad magic {bytes(self._mm[:4])!r})")
        try:
            self._parse()
        except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as e:
            if isinstance(e, GGUFError):
                raise
            raise GGUFError(f"{self.path} is truncated or corrupt: its header does not parse within the file's "
                            f"{len(self._mm)} bytes ({e}); an interrupted download or copy?") from None
        end = max((t.offset + t.num_bytes for t in self.tensors.values()), default=0)
        if end > len(self._mm):
            raise GGUFError(f"{self.path} is truncated: its tensors need {end} bytes, the file has {len(self._mm)} "
                            "(an interrupted download or copy?)")

    def _parse(self) -> None:
        """The header: version, metadata and the tensors' table (TensorInfo, offsets absolute)."""
        (self.version,) = self._read("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = self._read("<QQ")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._read("<I")
            self.metadata[key] = self._value(vtype)
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._read("<I")
            dims = self._read(f"<{n_dims}Q")
            ggml_type, offset = self._read("<IQ")
            raw.append((name, tuple(int(d) for d in dims), ggml_type, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, ggml_type, offset in raw:
            try:
                qtype = GGMLQuantizationType(ggml_type)
            except ValueError:
                raise GGUFError(f"{name}: unknown tensor type {ggml_type} (a newer GGUF than this reader "
                                "knows?)") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elements = int(np.prod(dims)) if dims else 1
            if dims[0] % block:
                raise GGUFError(f"{name}: row of {dims[0]} is not a multiple of the {qtype.name} block")
            self.tensors[name] = TensorInfo(
                name, tuple(reversed(dims)), qtype, data_start + offset, n_elements // block * type_size
            )

    # -- parsing helpers -------------------------------------------------------------------------------
    def _read(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        out = struct.unpack_from(fmt, self._mm, self._pos)
        self._pos += size
        return out

    def _string(self) -> str:
        (n,) = self._read("<Q")
        if self._pos + n > len(self._mm):
            raise ValueError(f"a string of {n} bytes at offset {self._pos}")
        s = self._mm[self._pos : self._pos + n].decode("utf-8", errors="replace")
        self._pos += n
        return s

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, n = self._read("<IQ")
            if etype in _NUMPY:
                arr = np.frombuffer(self._mm, dtype=_NUMPY[etype], count=n, offset=self._pos).copy()
                self._pos += arr.nbytes
                return arr
            return [self._value(etype) for _ in range(n)]
        if vtype in _SCALARS:
            fmt, _ = _SCALARS[vtype]
            return self._read(fmt)[0]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype}")

    # -- tensors ---------------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "llama"))

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, shaped (*leading_dims, bytes_per_row); no copy."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        buf = np.frombuffer(self._mm, dtype=np.uint8, count=info.num_bytes, offset=info.offset)
        return buf.reshape(rows, info.num_bytes // rows)

    def load(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32, in PyTorch shape order."""
        info = self.tensors[name]
        data = np.asarray(dequantize(self.raw(name), info.ggml_type), dtype=np.float32)
        if not data.flags.writeable:  # F32 tensors come back as views of the read-only mmap
            data = data.copy()
        return data.reshape(info.shape)

    def matrices(self) -> list[Matrix]:
        """(rows, row length, type name, e.g. "q4_k", a mixture of experts' matrix?) of every 2-D tensor, and of
        every 3-D one (experts' stacked matrices) as its rows together: what the gguf method keeps. Experts'
        matrices: the 3-D ones and the shared experts' (llama.cpp's names: ffn_*_exps, ffn_*_shexp)."""
        return [Matrix(int(np.prod(t.shape[:-1])), t.shape[-1], t.ggml_type.name.lower(),
                       len(t.shape) == 3 or "_shexp." in name)
                for name, t in self.tensors.items() if len(t.shape) in (2, 3)]

    def release(self, offset: int, num_bytes: int) -> None:
        """Drop the file's pages in [offset, offset + num_bytes) from this process (they were copied, e.g.
        repacked): page-aligned inside the range, so neighbours stay. A hint; errors are ignored."""
        page = mmap.PAGESIZE
        start = -(-offset // page) * page
        end = (offset + num_bytes) // page * page
        if end > start and hasattr(self._mm, "madvise"):
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass

    def quantization(self) -> str:
        """Tensor types by count, e.g. 'GGUF Q4_1 (210), F32 (61), Q8_0 (1)'."""
        counts = Counter(t.ggml_type.name for t in self.tensors.values())
        return "GGUF " + ", ".join(f"{k} ({v})" for k, v in counts.most_common())

    def close(self) -> None:
        self._mm.close()
