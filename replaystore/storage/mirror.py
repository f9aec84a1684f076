"""Decoded frames for stores of small observations: the whole ring kept decoded, within ``cache_bytes``.

For frames of a few bytes (CartPole's 16, LunarLander's 32) decoding costs per chunk, not per byte:
a ``sample(64)`` touches ~60 chunks, and joining and decoding their zstd frames was ~60% of the
call (docs/benchmarks.md, "Small observations"). Decoded, the whole ring of such frames is small
(1M CartPole frames: 16 MB), so the reader keeps every chunk it decodes in one array laid out by
slot, and gathers later batches from it with one ``np.take``, decoding only what it has not seen.

It is used where a frame is at most ``MIRROR_FRAME_BYTES`` and the ring decoded fits in half of
``cache_bytes``; its bytes are taken from the compressed cache's budget, so a store's RAM stays
within ``cache_bytes`` (sampling/memory.py). The array is allocated untouched (``np.zeros``): pages
are used as chunks arrive.

Consistency follows the compressed cache (chunkcache.py): a chunk is marked valid only if its
shard is still at the generation the batch was planned at (checked under the cache's lock), and
``invalidate`` (the writer rewrote the shard) clears the shard's chunks after the generation was
bumped. Frames are copied out while planning, under the store's lock, as the writer's own buffer is;
which chunks are valid is read before the copy, since another thread's decode may add one meanwhile.
"""

from __future__ import annotations

import numpy as np

from replaystore.storage.chunkcache import ChunkCache
from replaystore.storage.plan import take_into

#: Frames larger than this are decoded per batch as before: their decode cost is per byte.
MIRROR_FRAME_BYTES = 1024


def mirror_bytes(*, capacity: int, frame_nbytes: int, chunk_len: int, cache_bytes: int) -> int:
    """The bytes a ring of ``capacity`` frames takes decoded (whole chunks), or 0 where it is not mirrored."""
    n_chunks = -(-capacity // chunk_len)
    nbytes = n_chunks * chunk_len * frame_nbytes
    return nbytes if 0 < frame_nbytes <= MIRROR_FRAME_BYTES and nbytes <= cache_bytes // 2 else 0


class FrameMirror:
    """Decoded frames by slot (``frames``), which chunks of them are valid (``valid``), following
    ``cache``'s shard generations and lock."""

    def __init__(self, cache: ChunkCache, *, capacity: int, chunk_len: int, shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
        n_chunks = -(-capacity // chunk_len)
        self.cache = cache
        self.chunk_len = chunk_len
        self.chunks_per_shard = cache.chunks_per_shard
        self.frames = np.zeros((n_chunks * chunk_len, *shape), dtype=dtype)
        self.valid = np.zeros(n_chunks, dtype=bool)
        self.nbytes = self.frames.nbytes

    def have(self, slots: np.ndarray) -> np.ndarray:
        """Whether the frame at each of ``slots`` is here (its chunk is valid). Ask before ``gather``:
        a chunk another thread adds in between was not copied whole."""
        return self.valid[slots // self.chunk_len]

    def gather(self, slots: np.ndarray, parts: list[np.ndarray], bounds: list[int]) -> None:
        """Copy the frames at ``slots`` into ``parts`` laid end to end (``bounds``: where each part
        starts). Rows whose chunk is not valid get whatever the array holds there: the caller writes
        them again."""
        take_into(parts, bounds, self.frames, slots)

    def admit(self, ids: list[int], generations: np.ndarray, area: np.ndarray) -> None:
        """Keep chunks ``ids`` decoded in ``area[i]``, those whose shard is still at ``generations[i]``."""
        ids_a = np.asarray(ids, dtype=np.int64)
        cache = self.cache
        with cache.lock:
            current = np.asarray(cache.generation, dtype=np.int64)[ids_a // self.chunks_per_shard]
            keep = np.flatnonzero((current == generations) & ~self.valid[ids_a])
            if keep.size:
                chunks = self.frames.reshape(len(self.valid), self.chunk_len, *self.frames.shape[1:])
                chunks[ids_a[keep]] = area[keep]
                self.valid[ids_a[keep]] = True

    def invalidate(self, shard: int) -> None:
        """Forget ``shard``'s chunks (called after the cache bumped its generation)."""
        first = shard * self.chunks_per_shard
        with self.cache.lock:
            self.valid[first:first + self.chunks_per_shard] = False

    def clear(self) -> None:
        with self.cache.lock:
            self.valid[:] = False
