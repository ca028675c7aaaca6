"""BlockManager: the paged KV cache's bookkeeping, with automatic prefix caching (torch-free).

Physical blocks hold `block_size` tokens each. A request's block table maps its logical block i (tokens
[i*bs, (i+1)*bs)) to a physical block id. Blocks carry reference counts: a block shared by several
requests (a common prefix, or the n sequences of one prompt) is freed when the last one lets go.

Prefix cache: every *full* block gets a chain hash, hash((parent_hash, tokens of the block)), so one hash
names the whole prefix up to that block. `cached` maps hash -> block id. A block whose ref count drops to
0 goes to the tail of the free queue but keeps its hash: a later request with the same prefix can take it
back (a hit) until it is reused for something else, which happens in LRU order from the queue's head.
A hit is confirmed against the stored tokens and parent hash, so a hash collision can never serve the
wrong KV.

    free queue (LRU):  head -> [b7][b2][b9] <- tail      popping the head evicts b7's hash, if any

Sliding window on every layer (W): a query at position p reads keys (p - W, p] only, so once a request
has computed n tokens, a block whose tokens all lie before n - W + 1 is never read again.
`free_outside_window` lets go of it and leaves LEFT_WINDOW in its place in the block table (positions
keep their logical block index; the workers, told only of appended blocks, keep the old id, whose
contents their attention masks out). Such a block stays in the prefix cache like any freed block.

    W = 32, bs = 16, n = 70:  keys >= 39 are still read  ->  table [LEFT_WINDOW, LEFT_WINDOW, b9, b2, b6]
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tokenmill.engine.request import Request

_ROOT_HASH = 0x5EED
LEFT_WINDOW = -1  # a block table entry whose block left the sliding window and was freed


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    key: tuple[int, tuple[int, ...]] | None = None  # (parent_hash, tokens): confirms a hash hit


class NoFreeBlocksError(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.num_queries = 0  # prefix-cache lookups, in tokens (as vLLM counts them)
        self.num_hits = 0  # of which served from the cache

    # -- accounting ------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (unused, or cached with no owner)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks owned by live requests, 0-1."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ----------------------------------------------------------------------------------
    @staticmethod
    def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    @staticmethod
    def root_hash(req: Request) -> int:
        """The parent of a request's first block: one root for all, or one per cache_salt (vLLM's
        field), so that requests salted differently never share cached blocks."""
        salt = req.sampling_params.cache_salt
        return _ROOT_HASH if salt is None else hash((_ROOT_HASH, salt))

    def compute_block_hashes(self, req: Request) -> None:
        """Extend req.block_hashes to cover every full block of req.token_ids."""
        bs = self.block_size
        n_full = len(req.token_ids) // bs
        parent = req.block_hashes[-1] if req.block_hashes else self.root_hash(req)
        for i in range(len(req.block_hashes), n_full):
            parent = self.chain_hash(parent, tuple(req.token_ids[i * bs : (i + 1) * bs]))
            req.block_hashes.append(parent)

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Block ids holding the longest cached prefix of req (at most num_tokens - 1 tokens, so at least
        one token is left to compute and yield logits). Takes no references; see record_query."""
        if not self.enable_prefix_caching:
            return []
        self.compute_block_hashes(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        hit: list[int] = []
        parent = self.root_hash(req)
        bs = self.block_size
        for i in range(max_blocks):
            h = req.block_hashes[i]
            bid = self.cached.get(h)
            if bid is None:
                break
            blk = self.blocks[bid]
            if blk.key != (parent, tuple(req.token_ids[i * bs : (i + 1) * bs])):
                break  # a hash collision: never serve another prefix's KV
            hit.append(bid)
            parent = h
        return hit

    def record_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's prefix-cache lookup (in tokens, as vLLM counts them)."""
        if self.enable_prefix_caching:
            self.num_queries += num_tokens
            self.num_hits += num_hit_tokens

    def cache_full_blocks(self, req: Request) -> None:
        """Register req's full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        n_full = req.num_computed_tokens // self.block_size
        if n_full == 0:
            return
        self.compute_block_hashes(req)
        bs = self.block_size
        for i in range(n_full):
            if req.block_ids[i] == LEFT_WINDOW:
                continue  # it was cached (or not) before it was freed
            blk = self.blocks[req.block_ids[i]]
            if blk.block_hash is not None:
                continue
            h = req.block_hashes[i]
            if h in self.cached:
                continue  # another block already holds this prefix; keep the first
            parent = req.block_hashes[i - 1] if i else self.root_hash(req)
            blk.block_hash, blk.key = h, (parent, tuple(req.token_ids[i * bs : (i + 1) * bs]))
            self.cached[h] = blk.block_id

    # -- allocation ------------------------------------------------------------------------------------
    def _take(self, bid: int) -> None:
        blk = self.blocks[bid]
        if blk.ref_count == 0:
            del self.free_queue[bid]
        blk.ref_count += 1

    def _pop_free(self) -> int:
        bid, _ = self.free_queue.popitem(last=False)
        blk = self.blocks[bid]
        if blk.block_hash is not None:  # evict its cached prefix
            if self.cached.get(blk.block_hash) == bid:
                del self.cached[blk.block_hash]
            blk.block_hash = blk.key = None
        blk.ref_count = 1
        return bid

    def can_allocate(self, req: Request, num_new_tokens: int, shared: list[int] | None = None,
                     reserve: int = 0) -> bool:
        shared = shared or []
        have = len(req.block_ids) + len(shared)
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens) - have
        # shared blocks sitting in the free queue stop being free once taken (LEFT_WINDOW ones are not taken)
        num_free_shared = sum(1 for b in shared if b != LEFT_WINDOW and self.blocks[b].ref_count == 0)
        return need + reserve <= self.num_free_blocks - num_free_shared

    def allocate(self, req: Request, num_new_tokens: int, shared: list[int] | None = None) -> None:
        """Give req blocks for `num_new_tokens` more tokens, first taking references on `shared`
        (prefix-cache hits or a sibling's prompt blocks; LEFT_WINDOW entries, hits already outside the
        window, take nothing). Call can_allocate first."""
        for bid in shared or []:
            if bid != LEFT_WINDOW:
                self._take(bid)
            req.block_ids.append(bid)
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens) - len(req.block_ids)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"need {need} blocks, {self.num_free_blocks} free")
        for _ in range(need):
            req.block_ids.append(self._pop_free())

    def free(self, req: Request) -> None:
        """Drop req's references; blocks reaching 0 join the free queue's tail (freed last block first,
        so a request's prefix outlives its tail in the LRU)."""
        for bid in reversed(req.block_ids):
            if bid != LEFT_WINDOW:
                self._unref(bid)
        req.block_ids = []

    def _unref(self, bid: int) -> None:
        """Drop one reference to block bid; at 0 it joins the free queue's tail (its contents stay cached)."""
        blk = self.blocks[bid]
        blk.ref_count -= 1
        assert blk.ref_count >= 0, f"block {bid} freed twice"
        if blk.ref_count == 0:
            self.free_queue[bid] = None

    def free_outside_window(self, req: Request, window: int) -> int:
        """Every layer windowed by `window`: free req's blocks that hold only positions before
        num_computed_tokens - window + 1 (no later query reads them), first-to-last so the LRU evicts the
        oldest first. Returns how many it freed."""
        num_unread = (req.num_computed_tokens - window + 1) // self.block_size  # blocks wholly before the window
        freed = 0
        for i in range(min(num_unread, len(req.block_ids))):
            bid = req.block_ids[i]
            if bid == LEFT_WINDOW:
                continue
            self._unref(bid)
            req.block_ids[i] = LEFT_WINDOW
            freed += 1
        return freed

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by live requests."""
        return self.num_blocks - len(self.free_queue)

    def reset_prefix_cache(self) -> None:
        for blk in self.blocks:
            if blk.ref_count == 0:
                blk.block_hash = blk.key = None
        self.cached = {h: b for h, b in self.cached.items() if self.blocks[b].block_hash == h}
