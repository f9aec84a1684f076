"""The compressed-chunk cache of the read path: verified frame-chunk payloads by global chunk id,
bounded by ``cache_bytes``, first in first out.

First in, first out rather than LRU: uniform and prioritized draws have no recency to exploit, and
skipping the per-hit reordering makes planning cheaper. The newest data never waits here anyway: it
is in the writer's RAM (openshard.py).

Threads: payloads are looked up in ``lookup`` without a lock, on the hot path (a list or dict read
is atomic); everything that changes the cache holds ``lock``. The lookup is a list with a slot per
chunk of the ring (the fastest lookup: ``lookup``) up to ``LIST_CHUNKS`` chunks; past that, 8 bytes a
chunk would grow with the store rather than with the cache (250 MB for a 250M-step Atari store),
so it is the dict of cached chunks itself. Each
shard has a *generation*, bumped when the writer rewrites the shard: a payload read from the old
file by a plan made before the rewrite is not admitted (``admit`` compares generations), so the
cache never serves a chunk of a file newer or older than the current one.

Memory: a cached chunk costs its payload's ``bytes`` object plus ~16 bytes of bookkeeping where the
lookup is a list (its slot, and its cid in ``Fifo``, the insertion order as an int64 ring); an
``OrderedDict`` cost ~130 bytes a chunk (8 MB of a 30 MB cache of Atari chunks), a ``deque`` of ints
~40. A chunk forgotten by ``invalidate`` keeps its place in the order as a *stale* entry, counted in ``_stale``: its cid's stale entries are
always older than a live one, so eviction skips exactly that many (and the order is compacted when
stale entries outnumber live ones).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

#: The most chunks a ring may have for the cache to keep a list slot per chunk (8 MB of list: 8M Atari steps).
LIST_CHUNKS = 1 << 20
#: Stale entries the order may hold beyond the live ones before it is compacted.
STALE_SLACK = 4096


class Fifo:
    """Chunk ids in the order they were appended: an int64 ring that doubles when full."""

    def __init__(self) -> None:
        self._ids = np.empty(1024, dtype=np.int64)
        self._head = self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, cid: int) -> None:
        self.extend([cid])

    def extend(self, cids: list[int]) -> None:
        """Append ``cids`` in order (one numpy assignment)."""
        k = len(cids)
        if not k:
            return
        size = len(self._ids)
        if self._n + k > size:
            grown = max(2 * size, self._n + k)
            ids = np.empty(grown, dtype=np.int64)
            ids[: self._n] = np.take(self._ids, np.arange(self._head, self._head + self._n) % size)
            self._ids, self._head, size = ids, 0, grown
        start = self._head + self._n
        if start >= size:
            start -= size
        if start + k <= size:
            self._ids[start : start + k] = cids
        else:
            self._ids[(start + np.arange(k)) % size] = cids
        self._n += k

    def oldest(self, k: int) -> list[int]:
        """The ``k`` oldest ids (fewer if there are fewer), oldest first, left in place."""
        k = min(k, self._n)
        head, size = self._head, len(self._ids)
        if head + k <= size:
            return self._ids[head : head + k].tolist()
        return np.take(self._ids, np.arange(head, head + k) % size).tolist()

    def drop(self, k: int) -> None:
        """Forget the ``k`` oldest ids."""
        k = min(k, self._n)
        self._head = (self._head + k) % len(self._ids)
        self._n -= k

    def popleft(self) -> int:
        if not self._n:
            raise IndexError("pop from an empty Fifo")
        cid = self.oldest(1)[0]
        self.drop(1)
        return cid

    def ids(self) -> Iterator[int]:
        """Every id, oldest first (as Python ints a block at a time: no list of them all)."""
        size = len(self._ids)
        for at in range(0, self._n, 1 << 16):
            stop = min(self._n, at + (1 << 16))
            yield from np.take(self._ids, np.arange(self._head + at, self._head + stop) % size).tolist()


class ChunkCache:
    """Payloads of up to ``cache_bytes`` compressed bytes, for a ring of ``n_shards`` shards of
    ``chunks_per_shard`` chunks."""

    def __init__(self, *, n_shards: int, chunks_per_shard: int, cache_bytes: int) -> None:
        self.cache_bytes = cache_bytes
        self.chunks_per_shard = chunks_per_shard
        self.generation = [0] * n_shards
        self.lock = threading.Lock()
        self.held = 0  # bytes cached
        self._count = 0  # chunks cached
        self._order = Fifo()  # cids, oldest cached first (stale entries included)
        self._stale: dict[int, int] = {}  # cid -> its stale entries in _order
        n = n_shards * chunks_per_shard
        # the hot lookup, a slot per chunk (None: not cached), where the ring is small enough; else a dict
        self._slots: list[bytes | None] | None = [None] * n if n <= LIST_CHUNKS else None
        self._by_id: dict[int, bytes] = {}

    @property
    def slot_per_chunk(self) -> bool:
        """Whether lookups go through a list slot per chunk (else the dict of what is cached)."""
        return self._slots is not None

    @property
    def order_entries(self) -> int:
        """Entries in the insertion order, stale ones included (at most ``2 * chunks + STALE_SLACK``)."""
        return len(self._order)

    def __contains__(self, cid: int) -> bool:
        return self.get(cid) is not None

    def get(self, cid: int) -> bytes | None:
        return self._slots[cid] if self._slots is not None else self._by_id.get(cid)

    def lookup(self, ids: list[int]) -> list[bytes | None]:
        """The payload of each of ``ids`` (None where not cached), in one C-level pass."""
        slots = self._slots
        if slots is not None:
            return list(itemgetter(*ids)(slots)) if len(ids) > 1 else [slots[i] for i in ids]
        return list(map(self._by_id.get, ids, repeat(None)))

    def missing_any(self, first: int, stop: int) -> bool:
        """Whether a chunk of ``first .. stop - 1`` is not cached."""
        if self._slots is not None:
            return None in self._slots[first:stop]
        return any(cid not in self._by_id for cid in range(first, stop))

    def admit(self, reads: list[Any]) -> None:
        """Cache the payloads of ``reads`` (``shardfiles.ChunkRead``) whose shard is still at the
        generation they were planned at (takes ``lock`` once)."""
        per_shard, generation = self.chunks_per_shard, self.generation
        with self.lock:
            self.insert_many([(r.cid, r.payload) for r in reads
                              if r.payload is not None and r.generation == generation[r.cid // per_shard]])

    def insert(self, cid: int, payload: bytes) -> None:
        """Cache ``payload``, evicting the oldest-cached chunks (the caller holds ``lock``)."""
        self.insert_many([(cid, payload)])

    def insert_many(self, items: list[tuple[int, bytes]]) -> None:
        """Cache each ``(cid, payload)`` in order, then evict the oldest-cached chunks until the
        cache fits (the caller holds ``lock``). Evicting once after all of them keeps the same
        chunks as evicting after each: first in, first out keeps the newest run that fits."""
        cap, slots, by_id = self.cache_bytes, self._slots, self._by_id
        held, added = self.held, []
        for cid, payload in items:
            n = len(payload)
            if n > cap:
                continue
            if slots is not None:
                if slots[cid] is not None:
                    continue
                slots[cid] = payload
            else:
                if cid in by_id:
                    continue
                by_id[cid] = payload
            added.append(cid)
            held += n
        self._order.extend(added)
        self._count += len(added)
        self.held = held
        if held > cap:
            self._evict()

    def _evict(self) -> None:
        """Drop the oldest-cached chunks until the cache fits (stale entries skipped)."""
        cap, slots, by_id, stale, order = self.cache_bytes, self._slots, self._by_id, self._stale, self._order
        held, count = self.held, self._count
        while held > cap and len(order):
            oldest = order.oldest(64)
            used = 0
            for cid in oldest:
                if held <= cap:
                    break
                used += 1
                if stale and cid in stale:  # an entry of a chunk forgotten since
                    self._unstale(cid)
                    continue
                payload = slots[cid] if slots is not None else by_id.pop(cid)
                if slots is not None:
                    slots[cid] = None
                held -= len(payload)  # type: ignore[arg-type]
                count -= 1
            order.drop(used)
        self.held, self._count = held, count

    def invalidate(self, shard: int) -> None:
        """Forget ``shard``'s chunks and bump its generation (the writer rewrote it)."""
        first = shard * self.chunks_per_shard
        with self.lock:
            self.generation[shard] += 1
            for cid in range(first, first + self.chunks_per_shard):
                if self.get(cid) is not None:
                    self._drop(cid)
                    self._stale[cid] = self._stale.get(cid, 0) + 1
            if len(self._order) > 2 * self._count + STALE_SLACK:
                self._compact()

    def mean_bytes(self) -> int | None:
        """The mean size of a cached payload, or None when nothing is cached."""
        with self.lock:
            return max(1, self.held // self._count) if self._count else None

    def clear(self) -> None:
        with self.lock:
            self._order = Fifo()
            self._stale.clear()
            self._by_id.clear()
            if self._slots is not None:
                self._slots[:] = [None] * len(self._slots)
            self.held = self._count = 0

    def _put(self, cid: int, payload: bytes | None) -> None:
        if self._slots is not None:
            self._slots[cid] = payload
        elif payload is None:
            del self._by_id[cid]
        else:
            self._by_id[cid] = payload

    def _drop(self, cid: int) -> None:
        """Uncache ``cid`` (cached), leaving its entry in the order."""
        payload = self.get(cid)
        assert payload is not None
        self._put(cid, None)
        self.held -= len(payload)
        self._count -= 1

    def _unstale(self, cid: int) -> None:
        left = self._stale[cid] - 1
        if left:
            self._stale[cid] = left
        else:
            del self._stale[cid]

    def _compact(self) -> None:
        """The order without its stale entries (each cid's stale entries come before its live one)."""
        kept, block = Fifo(), []
        for cid in self._order.ids():
            if cid in self._stale:
                self._unstale(cid)
                continue
            block.append(cid)
            if len(block) == 1 << 16:  # (appended a block at a time: one numpy assignment each)
                kept.extend(block)
                block = []
        kept.extend(block)
        self._order = kept
