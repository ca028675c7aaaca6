"""StateCache: the recurrent-state slots of a model with recurrent layers, and prefix caching for them (torch-free).

A model like Qwen3.5 or LFM2 keeps, besides the KV cache of its attention layers, one recurrent state per sequence
(worker/recurrent_state.py holds the tensors; this class decides which slot holds what). A state covers every token
before it and cannot be rebuilt from cached KV blocks, so a prefix is reusable only where a copy of the state at
its end was kept: a *checkpoint*, the state after tokens [0, L) for L a multiple of the block size, keyed by the
chain hash of block L / bs - 1 (BlockManager's, which names the whole prefix). A request whose prompt starts with
cached KV blocks takes the longest such prefix that also has a checkpoint, and computes from there.

    slots [0, num_seqs)                        private: one per running sequence, its working state
    slots [num_seqs, num_seqs + checkpoints)   checkpoints, in LRU order when unreferenced

Where checkpoints are taken (vLLM keeps a state per block boundary; llama-server keeps a few per slot; this
keeps the boundaries a later request is likely to restart from):
  - a prompt's last boundary before its last token, ((num_tokens - 1) // bs) * bs: a repeated prompt, n > 1
    siblings, a preempted request's recompute;
  - where its prompt left the cached KV blocks (the end of the longest hit, when longer than the checkpoint it
    restored from): the point at which two requests' prompts diverged, where the next one will diverge too (a
    shared system prompt);
  - while decoding, at every block boundary, keeping the sequence's latest one only: the next turn of a chat
    starts with this turn's prompt and answer;
  - every `interval` tokens (1024) of a long prompt: a second request on the same long document restarts
    within `interval` of where it leaves it, not from token 0 (only the third would find the checkpoint the
    second leaves where they part).

A step's moves for one request are a StatePlan (scheduler_output.py): read slot `src` (-1: zeros, it starts at
token 0), compute in segments, segment i ending at position ends[i] and writing dsts[i]. No copies are made: a
checkpoint is written in place of the private slot at the boundary and read back by the next segment or step.
A checkpoint read by a step, or holding a running sequence's latest state, is referenced and never evicted; an
unreferenced one is evicted in LRU order when a new one needs its slot, decode-time ones first, and a decode-time
one never evicts a prompt's (a checkpoint that finds no slot is skipped). Invariants: a slot is in exactly one of {free, a sequence's private slot, a checkpoint};
refs(k) = the sequences whose state lives in k + the plans of the running step that read it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tokenmill.engine.request import Request
from tokenmill.scheduler_output import StatePlan


@dataclass
class _Checkpoint:
    slot: int
    refs: int = 0
    decode: bool = False  # taken at a decode step (a sequence's latest boundary), not in a prompt
    key: tuple[int, int] | None = None  # (block hash, length L) once registered; None: held by its writer only


@dataclass
class _SeqState:
    private: int  # its working slot, for as long as it runs
    current: int = -1  # the checkpoint slot its state lives in now (referenced), -1: its private slot (or zeros)
    # its latest decode-time checkpoint, (slot, key) (dropped when it takes the next one, if the slot still holds it:
    # evicted meanwhile, the slot may hold another's)
    decode_checkpoint: tuple[int, tuple[int, int] | None] = (-1, None)
    diverged_at: int = 0  # where its prompt left the cached KV blocks at admission (0: it did not), a checkpoint place
    pending: list[tuple[int, int]] = field(default_factory=list)  # this step's writes: (L, checkpoint slot)


class StateCache:
    def __init__(self, num_seqs: int, num_checkpoints: int, block_size: int, interval: int = 1024) -> None:
        self.num_seqs = num_seqs
        self.num_checkpoints = num_checkpoints
        self.block_size = block_size
        self.interval = max(block_size, interval // block_size * block_size)  # a multiple of the block size
        self._free_private = list(range(num_seqs - 1, -1, -1))  # a stack: the lowest slot first
        self._free_ckpt = list(range(num_seqs + num_checkpoints - 1, num_seqs - 1, -1))
        self._ckpt: dict[int, _Checkpoint] = {}  # slot -> checkpoint, for every slot not free
        self._by_key: dict[tuple[int, int], int] = {}  # (block hash, L) -> slot
        # registered, unreferenced checkpoints, oldest first: decode-time ones, prompt ones
        self._lru: tuple[OrderedDict[int, None], OrderedDict[int, None]] = (OrderedDict(), OrderedDict())
        self._seqs: dict[str, _SeqState] = {}
        self.num_restored = 0  # checkpoints restored by admitted requests (a counter, for stats)

    @property
    def num_slots(self) -> int:
        return self.num_seqs + self.num_checkpoints

    @property
    def num_running(self) -> int:
        """Sequences holding a private slot."""
        return len(self._seqs)

    @property
    def num_cached(self) -> int:
        """Registered checkpoints (in use or not)."""
        return len(self._by_key)

    # -- sequences -------------------------------------------------------------------------------------
    def admit(self, req: Request, restore: int = -1, diverged_at: int = 0) -> None:
        """req starts running (num_computed_tokens already set): it takes a private slot, and, when it restarts
        from the checkpoint in slot `restore` (found by `find`), a reference to it. diverged_at: where its prompt
        left the cached KV blocks (0: it did not), where it takes a checkpoint for the next such prompt."""
        if not self._free_private:
            raise RuntimeError(f"no recurrent-state slot left for {req.request_id}: {self.num_seqs} sequences hold "
                               "them (the scheduler runs at most that many)")
        st = self._seqs[req.request_id] = _SeqState(self._free_private.pop(), diverged_at=diverged_at)
        if restore >= 0:
            self._ref(restore)
            st.current = restore
            self.num_restored += 1
        elif req.num_computed_tokens:
            raise RuntimeError(f"{req.request_id} starts at token {req.num_computed_tokens} without a checkpoint of "
                               "the tokens before it")

    def release(self, req: Request) -> None:
        """req finished or was preempted: its private slot is free, its references dropped (its checkpoints stay
        cached; one written by its last step but not registered is freed)."""
        st = self._seqs.pop(req.request_id, None)
        if st is None:
            return
        for _, k in st.pending:
            self._unref(k)
        if st.current >= 0:
            self._unref(st.current)
        self._free_private.append(st.private)
        self._free_private.sort(reverse=True)

    # -- lookup ----------------------------------------------------------------------------------------
    def find(self, req: Request, num_hit_blocks: int) -> tuple[int, int]:
        """The longest prefix of req's first num_hit_blocks cached KV blocks (req.block_hashes computed) that has
        a checkpoint -> (its blocks, the checkpoint's slot), (0, -1) when none has."""
        for j in range(num_hit_blocks, 0, -1):
            k = self._by_key.get((req.block_hashes[j - 1], j * self.block_size))
            if k is not None:
                return j, k
        return 0, -1

    # -- planning a step -------------------------------------------------------------------------------
    def plan(self, req: Request, num_new: int) -> StatePlan:
        """req computes tokens [c, c + num_new) this step (c = num_computed_tokens): where its state comes from, the
        checkpoints it writes on the way (each takes a free or evicted slot; none left: skipped) and where it ends."""
        st = self._seqs[req.request_id]
        c, bs = req.num_computed_tokens, self.block_size
        end = c + num_new
        src = st.current if st.current >= 0 else (st.private if c else -1)
        if num_new == 1:  # a decode: at each block boundary
            wanted = [end] if end % bs == 0 else []
        else:  # a prompt chunk: every interval, where it left the cache, the prompt's last boundary
            every = range((c // self.interval + 1) * self.interval, end + 1, self.interval)
            wanted = sorted({L for L in (*every, st.diverged_at, (req.num_tokens - 1) // bs * bs)
                             if c < L <= end and L > 0})
        ends: list[int] = []
        dsts: list[int] = []
        for L in wanted:
            k = self._take(decode=num_new == 1)
            if k < 0:
                break
            ends.append(L)
            dsts.append(k)
            st.pending.append((L, k))
        if not ends or ends[-1] != end:
            ends.append(end)
            dsts.append(st.private)
        return StatePlan(src, ends, dsts)

    def update(self, req: Request) -> None:
        """After the step that ran req's plan (req.token_ids and num_computed_tokens advanced, block_hashes
        computed for its full blocks): register the checkpoints it wrote, move its reference to where its state
        now lives, and drop its previous decode checkpoint when it took a new one."""
        st = self._seqs.get(req.request_id)
        if st is None or not st.pending:
            if st is not None and st.current >= 0:  # its state moved back into its private slot
                self._unref(st.current)
                st.current = -1
            return
        last_L, last_k = st.pending[-1]
        for L, k in st.pending:
            self._register(k, req.block_hashes[L // self.block_size - 1], L)
        if st.current >= 0:
            self._unref(st.current)
        ends_at_checkpoint = last_L == req.num_computed_tokens
        if ends_at_checkpoint:  # its state lives in last_k now: keep the writer's reference
            st.current = last_k
        else:
            st.current = -1
            self._unref(last_k)
        for L, k in st.pending[:-1]:
            self._unref(k)
        decode = len(st.pending) == 1 and ends_at_checkpoint and last_L > req.num_prompt_tokens
        if decode:
            (prev, prev_key), st.decode_checkpoint = st.decode_checkpoint, (last_k, self._ckpt[last_k].key)
            if prev >= 0 and prev != last_k:
                self._drop_if_unused(prev, prev_key)
        st.pending = []

    # -- checkpoint slots ------------------------------------------------------------------------------
    def _take(self, decode: bool) -> int:
        """A slot for a new checkpoint, referenced by its writer: a free one, else the least recently used
        unreferenced decode-time one evicted, else (for a prompt's checkpoint only) the least recently used prompt
        one; -1 when none is. Sequences decoding at once take a boundary every block each, so they must not churn
        out the prompt checkpoints (a shared system prompt's) that every new request restarts from."""
        if self._free_ckpt:
            k = self._free_ckpt.pop()
        elif self._lru[0] or (self._lru[1] and not decode):
            k, _ = self._lru[0 if self._lru[0] else 1].popitem(last=False)
            self._forget(k)
        else:
            return -1
        self._ckpt[k] = _Checkpoint(k, refs=1, decode=decode)
        return k

    def _register(self, k: int, block_hash: int, L: int) -> None:
        key = (block_hash, L)
        ck = self._ckpt[k]
        if key in self._by_key and self._by_key[key] != k:
            return  # another sequence already cached this prefix's state: this copy is freed with its last reference
        ck.key = key
        self._by_key[key] = k

    def _ref(self, k: int) -> None:
        ck = self._ckpt[k]
        if ck.refs == 0:
            self._lru[not ck.decode].pop(k, None)
        ck.refs += 1

    def _unref(self, k: int) -> None:
        ck = self._ckpt[k]
        ck.refs -= 1
        assert ck.refs >= 0, f"checkpoint slot {k} released twice"
        if ck.refs == 0:
            if ck.key is None:
                self._free(k)
            else:
                self._lru[not ck.decode][k] = None  # the most recently used end

    def _drop_if_unused(self, k: int, key: tuple[int, int] | None) -> None:
        """Free checkpoint slot k if it still holds `key` and nothing references it."""
        ck = self._ckpt.get(k)
        if ck is not None and ck.refs == 0 and ck.key == key:
            self._lru[not ck.decode].pop(k, None)
            self._forget(k)
            self._free(k)

    def _forget(self, k: int) -> None:
        ck = self._ckpt[k]
        if ck.key is not None and self._by_key.get(ck.key) == k:
            del self._by_key[ck.key]
        ck.key = None

    def _free(self, k: int) -> None:
        del self._ckpt[k]
        self._free_ckpt.append(k)

    def check(self) -> None:
        """The invariants, for tests: every slot accounted for exactly once; refs match the sequences' uses."""
        private = [s.private for s in self._seqs.values()]
        assert len(set(private)) == len(private) and not set(private) & set(self._free_private)
        assert sorted(private + self._free_private) == list(range(self.num_seqs))
        assert sorted(list(self._ckpt) + self._free_ckpt) == list(range(self.num_seqs, self.num_slots))
        refs: dict[int, int] = {}
        for s in self._seqs.values():
            for k in [s.current] + [k for _, k in s.pending]:
                if k >= 0:
                    refs[k] = refs.get(k, 0) + 1
        for k, ck in self._ckpt.items():
            assert ck.refs == refs.get(k, 0), f"slot {k}: {ck.refs} refs, {refs.get(k, 0)} uses"
            assert (k in self._lru[not ck.decode]) == (ck.refs == 0), f"slot {k}: in its LRU iff unreferenced"
            assert k not in self._lru[ck.decode]
            assert ck.refs > 0 or ck.key is not None, f"slot {k}: an unreferenced checkpoint must be cached"
        assert all(self._ckpt[k].key == key for key, k in self._by_key.items())
