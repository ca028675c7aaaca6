"""The paged backend with decode attention by the native CPU kernel (tokenmill/native/kernels.cpp).

Decodes attend over the paged cache where it lies: the kernel walks each sequence's block table, so
there is no per-step gather of every block (the paged backend) and no contiguous copy to keep in step
(the decode mirror). At fp32 (and bf16 without AMX), prefill chunks whose context is at most NATIVE_PREFILL_MAX_KEYS keys go to
the same kernel call: each of a chunk's rows is a query at its own position over the chunk's block table
(its context ending at that position), and the kernel attends up to 16 such rows together, reading each
tile of keys once for all of them. So a step's attention is one call per layer, and a row gets the same
bits as a prefill row, a decode or a verification row (the kernel's result for a row depends only on its
keys, never on the rows beside it). At bf16 the same, on CPUs without AMX; there, with AVX512_BF16, prompt
rows take lane-wise tiles (kernels.cpp, attend_range_lanes: ~1.5x) whose last bits differ from a decode row's. Longer chunks (each 16 rows would
read the whole context again), chunks at bf16 on AMX (unmeasured against SDPA's kernels there), and everything the kernel does not take (a
dtype other than fp32 or bf16, a head dim not a multiple of 8, the kernels switched off or not built)
take the paged backend's torch path.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from tokenmill.attention.backend import AttentionMetadata, AttentionStep
from tokenmill.attention.paged import PagedAttentionBackend
from tokenmill.cpu_features import cpu_has_amx_bf16
from tokenmill.native import kernels

log = logging.getLogger(__name__)

# Prefill chunks of at most this many keys (cached prefix + chunk) attend on the kernel. Against SDPA per
# chunk at the default model's shapes, fp32, 2 threads, AVX2 (benchmarks/experiments/prefill_attention_ab.py,
# benchmarks/README.md): 1.6-1.8x for chunks of 64-512 with no prefix, 1.65x for 112 after 88, 1.1-1.25x at
# 512-1024 keys, 0.98x for 256 after 768; past 1024 keys each run of 16 rows re-reads more than it gains.
NATIVE_PREFILL_MAX_KEYS = 1024
# ... and while the step's prefill rows of more than one partition have at most this many partitions in all:
# the kernel keeps (m, l, acc) per such partition and query head until it merges them (2048 partitions:
# 4.9 MB for the default model, 30 MB for a 7B-class model's 28 heads of 128)
NATIVE_PREFILL_MAX_SPLIT_PARTITIONS = 2048


def split_partitions(start: int, n: int, part: int | None = None) -> int:
    """The partitions (of `part` keys, the kernel's by default) of the rows at positions start .. start + n - 1
    whose context spans more than one."""
    part = part or kernels.DEFAULT_PARTITION
    lo, hi = max(start + 1, part + 1), start + n  # the contexts of those rows: lo .. hi
    return _ceil_sum(hi, part) - _ceil_sum(lo - 1, part) if hi >= lo else 0


def _ceil_sum(n: int, part: int) -> int:
    """sum(ceil(c / part) for c in 1 .. n): q whole runs of `part` contexts (the k-th adds k each), then r more
    contexts adding q + 1 each."""
    q, r = divmod(n, part)
    return part * q * (q + 1) // 2 + r * (q + 1)


@dataclass
class NativeRows:
    """The step's first `count` tokens, attended in one kernel call: the decodes, then the rows of the
    first `chunks` prefill chunks."""

    count: int
    chunks: int  # prefill chunks covered (meta.prefills[:chunks])
    tables: torch.Tensor  # (count, max_blocks) int64: each row's block table (a chunk's rows share theirs)
    lens: torch.Tensor  # (count,) int64: each row's context, through its own position


class NativePagedAttentionBackend(PagedAttentionBackend):
    name = "native"

    def __init__(self, block_size: int, device: torch.device, kv: torch.Tensor) -> None:
        """kv: the whole paged cache, (2, layers, num_blocks, block_size, nkv, hd)."""
        super().__init__(block_size, device)
        self.use_kernel = (device.type == "cpu" and kernels.supports_dtype(kv.dtype) and kv.shape[-1] % 8 == 0
                           and kernels.is_enabled())
        if not self.use_kernel:
            log.info("native decode attention does not take %s K/V of head dim %d on %s (or the native kernels "
                     "are off): decodes gather their blocks as the paged backend does", kv.dtype, kv.shape[-1],
                     device)
        # prefill rows on the kernel at fp32, and at bf16 on CPUs without AMX (measured against SDPA there:
        # at bf16 on a 2-core Zen 4, 30 layers of the default model, chunks of 64-512 rows 1.6-2.5x, 212 after
        # 300 cached 1.2x; benchmarks/README.md, "8-bit VNNI panels"); at bf16 on AMX unmeasured, so SDPA
        # stays. TOKENMILL_NATIVE_PREFILL=0: off
        self.native_prefill = (self.use_kernel and (kv.dtype == torch.float32 or
                                                    (kv.dtype == torch.bfloat16 and not cpu_has_amx_bf16()))
                               and os.environ.get("TOKENMILL_NATIVE_PREFILL", "1") != "0")
        # prompt rows marked as such (the kernel's prefill_from): at bf16 with AVX512_BF16 they take the lane-wise
        # tiles (query heads in the lanes, vdpbf16ps), 1.45-1.52x the decode tiles for the default model's chunks
        # of 112-512 rows on a 2-core Zen 4 (benchmarks/experiments/prefill_attention_ab.py;
        # benchmarks/README.md, "Prompt rows on lane-wise tiles"); not under a sliding window, whose rows each
        # start at another key and so attend one at a time, where lanes for one row's heads measured 0.65-0.86x
        # the decode tiles. TOKENMILL_PROMPT_LANES=0: as decode rows
        self.prompt_lanes = os.environ.get("TOKENMILL_PROMPT_LANES", "1") != "0"

    def build_metadata(self, step: AttentionStep) -> AttentionMetadata:
        if not self.use_kernel:
            return super().build_metadata(step)
        decodes = step.decodes
        chunks = 0  # the leading prefill chunks the kernel takes
        if self.native_prefill:
            split = 0
            for s in step.prefills:
                split += split_partitions(s.start, s.num_tokens)
                if s.start + s.num_tokens > NATIVE_PREFILL_MAX_KEYS or split > NATIVE_PREFILL_MAX_SPLIT_PARTITIONS:
                    break
                chunks += 1
        if not decodes and not chunks:
            return super().build_metadata(step)
        seqs = decodes + step.prefills[:chunks]
        max_blocks = max(len(s.block_table) for s in seqs)
        tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs],
                              dtype=torch.long, device=self.device)
        d = len(decodes)
        lens = torch.tensor([s.start + 1 for s in decodes], dtype=torch.long, device=self.device)
        meta = self._metadata(step, list(range(d)), tables[:d] if d else None, None)
        if d:
            meta.decode_context_lens = lens
        if chunks:
            # a chunk's rows: its table repeated, contexts start + 1 .. start + num_tokens
            sizes = [1] * d + [s.num_tokens for s in step.prefills[:chunks]]
            row_tables = tables.repeat_interleave(torch.tensor(sizes, device=self.device), dim=0)
            row_lens = torch.cat([lens] + [torch.arange(s.start + 1, s.start + s.num_tokens + 1, device=self.device)
                                           for s in step.prefills[:chunks]])
            meta.extra = NativeRows(len(row_lens), chunks, row_tables, row_lens)
        return meta

    def attend_rows(self, out: torch.Tensor, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                    meta: AttentionMetadata, scale: float, window: int = 0, softcap: float = 0.0,
                    sinks: torch.Tensor | None = None) -> int | None:
        """The decodes and the NativeRows' prefill chunks in one kernel call -> out[:rows.count]; None when
        the step has no NativeRows or the kernel did not take these tensors (a stride)."""
        rows = meta.extra
        if not isinstance(rows, NativeRows):
            return None
        starts = None  # (n,) int64: each row's first key position, lens - W, once per step and window
        if window > 0:
            starts = meta.window_cache.get(("row_starts", window))
            if starts is None:
                starts = meta.window_cache[("row_starts", window)] = (rows.lens - window).clamp_(min=0)
        n = rows.count
        if kernels.paged_decode_attention(out[:n], q[:n], kv_cache[0], kv_cache[1], rows.tables, rows.lens, scale,
                                          starts=starts, softcap=softcap,
                                          prefill_from=meta.num_decodes if self.prompt_lanes and not window else None,
                                          sinks=_fp32(sinks)):
            return rows.chunks
        return None

    def decode_attention(self, out: torch.Tensor, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                         scale: float, window: int = 0, softcap: float = 0.0,
                         sinks: torch.Tensor | None = None) -> None:
        d, lens, tables = meta.num_decodes, meta.decode_context_lens, meta.decode_block_tables
        if lens is not None and tables is not None:
            starts = None  # (D,) int64: each decode's first key position, lens - W, once per step and window
            if window > 0:
                starts = meta.window_cache.get(("starts", window))
                if starts is None:
                    starts = meta.window_cache[("starts", window)] = (lens - window).clamp_(min=0)
            if kernels.paged_decode_attention(out[:d], q[:d], kv_cache[0], kv_cache[1], tables, lens, scale,
                                              starts=starts, softcap=softcap, sinks=_fp32(sinks)):
                return
            if meta.decode_mask is None:  # tensors the kernel did not take (a stride): the masked gather
                keys = torch.arange(tables.shape[1] * self.block_size, device=lens.device)
                meta.decode_mask = (keys[None, :] < lens[:, None])[:, None, None, :]
        super().decode_attention(out, layer_idx, q, k, v, kv_cache, meta, scale, window, softcap, sinks)


def _fp32(sinks: torch.Tensor | None) -> torch.Tensor | None:
    """The sinks as the kernel takes them: (nh,) float32, contiguous."""
    return None if sinks is None else sinks.detach().float().contiguous()
