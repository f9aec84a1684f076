"""The frame array's shard files as the read path sees them: each chunk's verified compressed bytes,
read through descriptors kept open with their parsed shard index: where a chunk's bytes come from,
apart from what the reader does with them.

A shard's index is read once, when its file is opened, and kept with the open descriptor; a chunk is
then one ``pread``, checked against its crc32c. At most ``max_open`` files stay open (least
recently used closed first).

Consistency for readers in other processes: the index and the chunk bytes of a shard always come
from the same open file (a rewritten shard is a new file renamed over the old, so an open descriptor
keeps the old, whole version). The writing process drops a shard's descriptor whenever it rewrites
it (``drop``). A read-only store calls ``snapshot()`` when it opens: every frame shard file is opened
then and kept open, so however far a writer in another process moves on (and wraps the ring), the
reader keeps reading the files of the commit it opened at (up to SNAPSHOT_MAX_SHARDS shards, 2M
steps at the default layout; a bigger store opens shards lazily, and a reader that outlives a whole
lap of the writer can then read newer frames: reopen such readers).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from replaystore.errors import ChunkChecksumError
from replaystore.format.shards import (
    CRC_BYTES,
    EMPTY,
    INDEX_ENTRY_BYTES,
    check_chunk,
    parse_index,
    shard_key,
)

log = logging.getLogger(__name__)

MAX_OPEN_SHARDS = 128
SNAPSHOT_MAX_SHARDS = 512  # file descriptors: stay well inside the usual limit of 1024
NAME = "obs"


class ShardFiles:
    """Verified chunk bytes of the ``obs`` array's shards under ``root``."""

    def __init__(self, root: Path, *, ndim: int, capacity: int, shard_len: int, chunk_len: int) -> None:
        self.root = root
        self.ndim = ndim  # dimensions of one frame (the shard file names carry one 0 per dimension)
        self.capacity = capacity
        self.shard_len = shard_len
        self.chunk_len = chunk_len
        self.chunks_per_shard = shard_len // chunk_len
        self.max_open = MAX_OPEN_SHARDS
        self._tail = self.chunks_per_shard * INDEX_ENTRY_BYTES + CRC_BYTES
        self._handles: OrderedDict[int, tuple[int, np.ndarray, int]] = OrderedDict()  # shard -> (fd, index, size)

    def chunk(self, cid: int) -> bytes | None:
        """Global chunk ``cid``'s compressed bytes, checked, or None for a chunk never written."""
        shard, chunk = divmod(cid, self.chunks_per_shard)
        fd, index, size = self._handle(shard)
        off, nbytes = index[chunk]
        if off == EMPTY:
            return None
        first_slot = cid * self.chunk_len
        if int(off) + int(nbytes) > size or nbytes < CRC_BYTES:
            raise ChunkChecksumError(
                f"chunk {chunk} of shard {shard} of '{NAME}' (slots {first_slot}..{first_slot + self.chunk_len - 1}) "
                "points outside its shard file; the store is damaged: run `replaystore verify`",
                array=NAME, shard=shard, chunk=chunk,
            )
        return self.check(os.pread(fd, int(nbytes), int(off)), cid)

    def check(self, raw: bytes | memoryview, cid: int) -> bytes:
        """``raw`` (a chunk's stored bytes, checksum included) verified, as the chunk's payload."""
        shard, chunk = divmod(cid, self.chunks_per_shard)
        return bytes(check_chunk(raw, name=NAME, shard=shard, chunk=chunk, first_step=cid * self.chunk_len,
                                 steps=self.chunk_len))

    def whole(self, shard: int) -> tuple[memoryview, list[tuple[int, int]]] | None:
        """A shard file read in one go, with its chunks' ``(offset, nbytes)``, or None if it does not exist.
        Offsets may point past the chunk area of a damaged file: callers check against ``len - tail``."""
        try:
            raw = memoryview((self.root / shard_key(NAME, shard, self.ndim)).read_bytes())
        except FileNotFoundError:
            return None
        index = parse_index(raw[max(0, len(raw) - self._tail):], self.chunks_per_shard, name=NAME, shard=shard)
        return raw[: max(0, len(raw) - self._tail)], index.tolist()

    def snapshot(self) -> bool:
        """Open every shard file now and keep them all open (see the module docstring); returns
        False, doing nothing, for a store of more than SNAPSHOT_MAX_SHARDS shards."""
        n_shards = -(-self.capacity // self.shard_len)
        if n_shards > SNAPSHOT_MAX_SHARDS:
            return False
        self.max_open = max(MAX_OPEN_SHARDS, n_shards)
        for shard in range(n_shards):
            try:
                self._handle(shard)
            except ChunkChecksumError:
                pass  # missing or damaged: reported when (and if) a read needs it
            except OSError as exc:  # out of file descriptors: fall back to opening shards lazily
                log.warning("could not keep all %d shard files of %s open (%s); opening them lazily", n_shards,
                            self.root, exc)
                return False
        return True

    def drop(self, shard: int) -> None:
        """Close ``shard``'s file (the writer just rewrote it; the next read opens the new one)."""
        handle = self._handles.pop(shard, None)
        if handle is not None:
            os.close(handle[0])

    def close(self) -> None:
        for fd, _, _ in self._handles.values():
            os.close(fd)
        self._handles.clear()

    def _handle(self, shard: int) -> tuple[int, np.ndarray, int]:
        handle = self._handles.get(shard)
        if handle is not None:
            self._handles.move_to_end(shard)
            return handle
        path = self.root / shard_key(NAME, shard, self.ndim)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkChecksumError(
                f"shard {shard} of '{NAME}' ({path}) is missing although the store's state says it holds live "
                "steps; the store is damaged: run `replaystore verify`",
                array=NAME, shard=shard, chunk=None,
            ) from None
        try:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, self._tail, max(0, size - self._tail))
            index = parse_index(tail, self.chunks_per_shard, name=NAME, shard=shard)
        except BaseException:
            os.close(fd)
            raise
        handle = (fd, index, size - self._tail)
        self._handles[shard] = handle
        if len(self._handles) > self.max_open:
            _, (old_fd, _, _) = self._handles.popitem(last=False)
            os.close(old_fd)
        return handle
