"""Chunk-aware frame reads: positions -> frames, each needed chunk fetched and decoded once.

For a batch, the frames it needs (stacks and next frames) are mapped to their chunks; each chunk's
compressed bytes come from the compressed-chunk cache or are read with one ``pread`` using the
shard's index (read once per shard file and kept with its open file descriptor), checked against
their crc32c, decoded into a reused buffer, and the frames are gathered with one numpy fancy index.
There is no per-transition Python loop: the only loop is over distinct chunks.

Steps still in the writer's RAM buffer (the shard being filled) are served from there.

Consistency for readers in other processes: the index and the chunk bytes of a shard always come
from the same open file (a rewritten shard is a new file renamed over the old, so an open descriptor
keeps the old, whole version). The writing process drops its cache of a shard whenever it rewrites it.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from replaystore.errors import ChunkChecksumError
from replaystore.schema import Layout, Schema
from replaystore.shards import (
    CRC_BYTES,
    EMPTY,
    INDEX_ENTRY_BYTES,
    check_chunk,
    decode_chunk,
    numcodecs_codec,
    parse_index,
    shard_key,
)

log = logging.getLogger(__name__)

MAX_OPEN_SHARDS = 128
#: ``(shard, buffer)`` of the writer's current shard, or None; rows of ``buffer`` are slots.
LiveRegion = Callable[[], "tuple[int, np.ndarray] | None"]


class FrameReader:
    """Reads frames by position from the ``obs`` array's shards, with a compressed-chunk cache."""

    def __init__(self, root: Path, schema: Schema, layout: Layout, *, cache_bytes: int, live_region: LiveRegion | None = None) -> None:
        self.root = root
        self.capacity = schema.capacity
        self.shape = schema.observation.shape
        self.dtype = np.dtype(schema.observation.dtype)
        self.chunk_len = layout.obs_chunk_len
        self.shard_len = layout.shard_len
        self.chunks_per_shard = layout.shard_len // layout.obs_chunk_len
        self.codec = numcodecs_codec(layout.codec)
        self.cache_bytes = cache_bytes
        self.live_region = live_region
        self._handles: OrderedDict[int, tuple[int, np.ndarray, int]] = OrderedDict()  # shard -> (fd, index, size)
        self._chunks: OrderedDict[int, bytes] = OrderedDict()  # global chunk id -> verified payload
        self._held = 0
        self._decoded = np.empty((0, self.chunk_len, *self.shape), dtype=self.dtype)
        self.hits = 0
        self.misses = 0

    # ---------------------------------------------------------------------------------------------
    # Public

    @property
    def bytes_held(self) -> int:
        """Compressed bytes in the chunk cache."""
        return self._held

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """Frames at ``positions`` (any shape of int64 positions) as ``(*positions.shape, *obs_shape)``."""
        flat = np.asarray(positions, dtype=np.int64).ravel()
        slots = flat % self.capacity
        out = np.empty((flat.size, *self.shape), dtype=self.dtype)
        from_disk = np.ones(flat.size, dtype=bool)
        region = self.live_region() if self.live_region is not None else None
        if region is not None:
            shard, buffer = region
            in_buffer = (slots // self.shard_len) == shard
            if in_buffer.any():
                out[in_buffer] = buffer[slots[in_buffer] - shard * self.shard_len]
                from_disk = ~in_buffer
        if from_disk.any():
            disk_slots = slots[from_disk]
            chunk_ids, inverse = np.unique(disk_slots // self.chunk_len, return_inverse=True)
            decoded = self._decode_area(chunk_ids.size)
            for i, cid in enumerate(chunk_ids.tolist()):
                self._decode_into(cid, decoded[i])
            out[from_disk] = decoded[inverse, disk_slots % self.chunk_len]
        return out.reshape(*np.shape(positions), *self.shape)

    def invalidate(self, shard: int) -> None:
        """Forget everything cached about ``shard`` (the writer just rewrote it)."""
        handle = self._handles.pop(shard, None)
        if handle is not None:
            os.close(handle[0])
        first = shard * self.chunks_per_shard
        for cid in range(first, first + self.chunks_per_shard):
            payload = self._chunks.pop(cid, None)
            if payload is not None:
                self._held -= len(payload)

    def close(self) -> None:
        for fd, _, _ in self._handles.values():
            os.close(fd)
        self._handles.clear()
        self._chunks.clear()
        self._held = 0

    # ---------------------------------------------------------------------------------------------
    # Internals

    def _decode_area(self, n: int) -> np.ndarray:
        if self._decoded.shape[0] < n:
            self._decoded = np.empty((max(n, 2 * self._decoded.shape[0]), self.chunk_len, *self.shape), dtype=self.dtype)
        return self._decoded

    def _decode_into(self, cid: int, out: np.ndarray) -> None:
        payload = self._chunks.get(cid)
        if payload is not None:
            self.hits += 1
            self._chunks.move_to_end(cid)
        else:
            self.misses += 1
            payload = self._fetch(cid)
            if payload is None:
                out[...] = 0
                return
            self._remember(cid, payload)
        shard, chunk = divmod(cid, self.chunks_per_shard)
        decode_chunk(memoryview(payload), self.codec, out, name="obs", shard=shard, chunk=chunk)

    def _remember(self, cid: int, payload: bytes) -> None:
        if len(payload) > self.cache_bytes:
            return
        self._chunks[cid] = payload
        self._held += len(payload)
        while self._held > self.cache_bytes:
            _, old = self._chunks.popitem(last=False)
            self._held -= len(old)

    def _fetch(self, cid: int) -> bytes | None:
        shard, chunk = divmod(cid, self.chunks_per_shard)
        fd, index, size = self._handle(shard)
        off, nbytes = index[chunk]
        if off == EMPTY:
            return None
        first_slot = cid * self.chunk_len
        if int(off) + int(nbytes) > size or nbytes < CRC_BYTES:
            raise ChunkChecksumError(
                f"chunk {chunk} of shard {shard} of 'obs' (slots {first_slot}..{first_slot + self.chunk_len - 1}) "
                "points outside its shard file; the store is damaged: run `replaystore verify`",
                array="obs", shard=shard, chunk=chunk,
            )
        raw = os.pread(fd, int(nbytes), int(off))
        payload = check_chunk(raw, name="obs", shard=shard, chunk=chunk, first_step=first_slot, steps=self.chunk_len)
        return bytes(payload)

    def _handle(self, shard: int) -> tuple[int, np.ndarray, int]:
        handle = self._handles.get(shard)
        if handle is not None:
            self._handles.move_to_end(shard)
            return handle
        path = self.root / shard_key("obs", shard, len(self.shape))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkChecksumError(
                f"shard {shard} of 'obs' ({path}) is missing although the store's state says it holds live steps; "
                "the store is damaged: run `replaystore verify`",
                array="obs", shard=shard, chunk=None,
            ) from None
        try:
            size = os.fstat(fd).st_size
            tail_len = self.chunks_per_shard * INDEX_ENTRY_BYTES + CRC_BYTES
            tail = os.pread(fd, tail_len, max(0, size - tail_len))
            index = parse_index(tail, self.chunks_per_shard, name="obs", shard=shard)
        except BaseException:
            os.close(fd)
            raise
        handle = (fd, index, size - tail_len)
        self._handles[shard] = handle
        if len(self._handles) > MAX_OPEN_SHARDS:
            _, (old_fd, _, _) = self._handles.popitem(last=False)
            os.close(old_fd)
        return handle
