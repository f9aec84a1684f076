"""The compressed-chunk cache of the read path: verified frame-chunk payloads by global chunk id,
bounded by ``cache_bytes``, first in first out.

First in, first out rather than LRU: uniform and prioritized draws have no recency to exploit, and
skipping the per-hit reordering makes planning cheaper. The newest data never waits here anyway: it
is in the writer's RAM (openshard.py).

Threads: payloads are looked up in ``by_id`` (one list slot per chunk of the ring) without a lock,
on the hot path (a list read is atomic); everything that changes the cache holds ``lock``. Each
shard has a *generation*, bumped when the writer rewrites the shard: a payload read from the old
file by a plan made before the rewrite is not admitted (``admit`` compares generations), so the
cache never serves a chunk of a file newer or older than the current one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class ChunkCache:
    """Payloads of up to ``cache_bytes`` compressed bytes, for a ring of ``n_shards`` shards of
    ``chunks_per_shard`` chunks."""

    def __init__(self, *, n_shards: int, chunks_per_shard: int, cache_bytes: int) -> None:
        self.cache_bytes = cache_bytes
        self.chunks_per_shard = chunks_per_shard
        self.by_id: list[bytes | None] = [None] * (n_shards * chunks_per_shard)  # the hot lookup
        self.generation = [0] * n_shards
        self.lock = threading.Lock()
        self.held = 0  # bytes cached
        self._order: OrderedDict[int, bytes] = OrderedDict()  # the same payloads, oldest cached first

    def __contains__(self, cid: int) -> bool:
        return self.by_id[cid] is not None

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
        if len(payload) > self.cache_bytes or self.by_id[cid] is not None:
            return
        self._order[cid] = self.by_id[cid] = payload
        self.held += len(payload)
        while self.held > self.cache_bytes:  # popitem(last=False): O(1), where a dict's first key is not
            oldest, dropped = self._order.popitem(last=False)
            self.held -= len(dropped)
            self.by_id[oldest] = None

    def invalidate(self, shard: int) -> None:
        """Forget ``shard``'s chunks and bump its generation (the writer rewrote it)."""
        first = shard * self.chunks_per_shard
        with self.lock:
            self.generation[shard] += 1
            for cid in range(first, first + self.chunks_per_shard):
                payload = self._order.pop(cid, None)
                if payload is not None:
                    self.held -= len(payload)
                    self.by_id[cid] = None

    def mean_bytes(self) -> int | None:
        """The mean size of a cached payload, or None when nothing is cached."""
        with self.lock:
            return max(1, self.held // len(self._order)) if self._order else None

    def clear(self) -> None:
        with self.lock:
            self._order.clear()
            self.by_id[:] = [None] * len(self.by_id)
            self.held = 0
