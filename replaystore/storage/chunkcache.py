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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import repeat
from operator import itemgetter
from typing import Any

#: The most chunks a ring may have for the cache to keep a list slot per chunk (8 MB of list: 8M Atari steps).
LIST_CHUNKS = 1 << 20


class ChunkCache:
    """Payloads of up to ``cache_bytes`` compressed bytes, for a ring of ``n_shards`` shards of
    ``chunks_per_shard`` chunks."""

    def __init__(self, *, n_shards: int, chunks_per_shard: int, cache_bytes: int) -> None:
        self.cache_bytes = cache_bytes
        self.chunks_per_shard = chunks_per_shard
        self.generation = [0] * n_shards
        self.lock = threading.Lock()
        self.held = 0  # bytes cached
        self._order: OrderedDict[int, bytes] = OrderedDict()  # the payloads, oldest cached first
        n = n_shards * chunks_per_shard
        # the hot lookup, a slot per chunk (None: not cached), where the ring is small enough
        self._slots: list[bytes | None] | None = [None] * n if n <= LIST_CHUNKS else None

    @property
    def slot_per_chunk(self) -> bool:
        """Whether lookups go through a list slot per chunk (else the dict of what is cached)."""
        return self._slots is not None

    def __contains__(self, cid: int) -> bool:
        return self.get(cid) is not None

    def get(self, cid: int) -> bytes | None:
        return self._slots[cid] if self._slots is not None else self._order.get(cid)

    def lookup(self, ids: list[int]) -> list[bytes | None]:
        """The payload of each of ``ids`` (None where not cached), in one C-level pass."""
        slots = self._slots
        if slots is not None:
            return list(itemgetter(*ids)(slots)) if len(ids) > 1 else [slots[i] for i in ids]
        return list(map(self._order.get, ids, repeat(None)))

    def missing_any(self, first: int, stop: int) -> bool:
        """Whether a chunk of ``first .. stop - 1`` is not cached."""
        if self._slots is not None:
            return None in self._slots[first:stop]
        return any(cid not in self._order for cid in range(first, stop))

    def admit(self, reads: list[Any]) -> None:
        """Cache the payloads of ``reads`` (``shardfiles.ChunkRead``) whose shard is still at the
        generation they were planned at (takes ``lock`` once)."""
        per_shard, generation = self.chunks_per_shard, self.generation
        with self.lock:
            for r in reads:
                if r.payload is not None and r.generation == generation[r.cid // per_shard]:
                    self.insert(r.cid, r.payload)

    def insert(self, cid: int, payload: bytes) -> None:
        """Cache ``payload``, evicting the oldest-cached chunks (the caller holds ``lock``)."""
        if len(payload) > self.cache_bytes or cid in self._order:
            return
        self._order[cid] = payload
        if self._slots is not None:
            self._slots[cid] = payload
        self.held += len(payload)
        while self.held > self.cache_bytes:  # popitem(last=False): O(1), where a dict's first key is not
            oldest, dropped = self._order.popitem(last=False)
            self.held -= len(dropped)
            if self._slots is not None:
                self._slots[oldest] = None

    def invalidate(self, shard: int) -> None:
        """Forget ``shard``'s chunks and bump its generation (the writer rewrote it)."""
        first = shard * self.chunks_per_shard
        with self.lock:
            self.generation[shard] += 1
            for cid in range(first, first + self.chunks_per_shard):
                payload = self._order.pop(cid, None)
                if payload is not None:
                    self.held -= len(payload)
                    if self._slots is not None:
                        self._slots[cid] = None

    def mean_bytes(self) -> int | None:
        """The mean size of a cached payload, or None when nothing is cached."""
        with self.lock:
            return max(1, self.held // len(self._order)) if self._order else None

    def clear(self) -> None:
        with self.lock:
            self._order.clear()
            if self._slots is not None:
                self._slots[:] = [None] * len(self._slots)
            self.held = 0
