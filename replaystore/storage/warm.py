"""``warm_cache()``: whole shards into the compressed-chunk cache, ``GROUP`` at a time (on object
storage, their GETs all in flight at once), every chunk's crc32c checked, until the cache is full.

A payload is admitted only if its shard's generation is still what it was before its bytes were
read (``ChunkCache.admit``), so a shard that a writer or a ``refresh()`` re-pointed meanwhile stays
out of the cache, exactly as for a batch's own reads. A store on object storage does this read on
its first cache miss, when the view fits the cache (``FrameReader``'s first miss).
"""

from __future__ import annotations

import google_crc32c

from replaystore.format.shards import CRC_BYTES, EMPTY_OFFSET
from replaystore.storage.backend import FrameShards
from replaystore.storage.chunkcache import ChunkCache
from replaystore.storage.decoders import declared_size

#: Shards read at once on object storage (GETs in flight; ~16 MB of a 1M-step Atari store); a local
#: store reads them one at a time.
GROUP = 64
crc = google_crc32c.value


class _Loaded:
    """A verified payload for ``ChunkCache.admit`` (a ``ChunkRead``'s fields that it reads)."""

    __slots__ = ("cid", "generation", "payload")

    def __init__(self, cid: int, generation: int, payload: bytes) -> None:
        self.cid, self.generation, self.payload = cid, generation, payload


def warm(cache: ChunkCache, files: FrameShards, shards: range | list[int], *, chunk_nbytes: int,
         odd: set[int] | None) -> int:
    """Read ``shards`` of ``files`` whole into ``cache``, ``GROUP`` at a time, until the cache is full;
    returns the compressed bytes added. ``odd`` (where chunks are decoded joined, reader.py) gets the
    chunks whose frame does not declare ``chunk_nbytes``."""
    per_shard = files.chunks_per_shard
    shards = list(shards)
    added = 0
    for at in range(0, len(shards), GROUP):
        group = [s for s in shards[at : at + GROUP] if cache.missing_any(s * per_shard, (s + 1) * per_shard)]
        if not group:
            continue
        generations = [cache.generation[s] for s in group]  # before the keys and bytes are read
        room = cache.cache_bytes - cache.held
        full = False
        for shard, generation, got in zip(group, generations, files.wholes(group)):
            if got is None:
                continue
            raw, index = got
            loaded: list[_Loaded] = []
            for chunk, (off, nbytes) in enumerate(index):
                cid = shard * per_shard + chunk
                if off == EMPTY_OFFSET or cid in cache:
                    continue
                room -= nbytes
                if room < 0:
                    full = True
                    break
                stored = raw[off : off + nbytes]
                payload = bytes(stored[:-CRC_BYTES])
                if len(stored) != nbytes or crc(payload) != int.from_bytes(stored[-CRC_BYTES:], "little"):
                    payload = files.check(stored, cid)  # raises ChunkChecksumError naming the chunk
                if odd is not None and declared_size(payload) != chunk_nbytes:
                    odd.add(cid)
                loaded.append(_Loaded(cid, generation, payload))
            before = cache.held
            cache.admit(loaded)  # shard by shard: its bytes and its list go before the next is read
            added += max(0, cache.held - before)
            if full:
                break
        if full:
            break
    return added
