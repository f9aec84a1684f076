"""Deferred reads: a chunk located in a shard whose file is not open, read by a later ``read``
without holding more descriptors than the store may (shardfiles.py's docstring has the why).

A deferred ``ChunkRead`` carries the identity (inode, device, mtime, size) of the file version its
range was taken from. ``_read_deferred`` reads such reads a shard at a time: it opens the file and,
if it is that version, reads through it; the file is then kept in the LRU if there is room, else
closed before the next shard is opened. Two things can replace the file in between:

- this process's writer: it calls ``before_replace`` before it renames a new file over the shard,
  and the shard's deferred reads are given a descriptor of the file still in place (the version
  they were planned on);
- a writer in another process: the file opened is a newer version, and the reads are pointed at
  their chunks through that file's own index (``_relocate``): the newer frames of the planned
  slots, as a reader that opens shards lazily could always read. (A read-only store that keeps
  every file open, ``snapshot()``, never defers.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from replaystore.errors import ChunkChecksumError
from replaystore.format.shards import CRC_BYTES, EMPTY_OFFSET, INDEX_ENTRY, INDEX_ENTRY_BYTES
from replaystore.storage.backend import KNOWN_INDEX_BYTES
from replaystore.storage.chunkread import ChunkRead

NAME = "obs"
Identity = tuple[int, int, int, int]  # a file version: inode, device, mtime (ns), size


class ShardHandle:
    """An open shard file with its parsed index. ``pins`` counts reads planned on it and not yet
    done: a handle retired (evicted, or its shard rewritten) while pinned stays open until the last
    of them has read, so a planned read always reads the file version it was planned on."""

    __slots__ = ("fd", "index", "size", "pins", "retired")

    def __init__(self, fd: int, index: bytes, size: int) -> None:
        self.fd = fd
        self.index = index  # the shard index: (offset, nbytes) little-endian uint64 pairs, checked
        self.size = size  # bytes before the index: chunk bytes must lie below this
        self.pins = 0
        self.retired = False


class KnownIndexes:
    """Shard indexes already read and checked, by shard, with the file version they belong to: a
    shard reopened unchanged skips reading its index again. 16 bytes a chunk: kept for the shards
    read most recently up to ``budget_bytes`` (64 MB: 4,000 Atari shards of 4,096 frames), so that
    they do not grow with the store (500 MB for every shard of a 250M-step Atari store)."""

    def __init__(self, budget_bytes: int = KNOWN_INDEX_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.held = 0
        self._known: OrderedDict[int, tuple[Identity, bytes]] = OrderedDict()

    def get(self, shard: int) -> tuple[Identity, bytes] | None:
        entry = self._known.get(shard)
        if entry is not None:
            self._known.move_to_end(shard)
        return entry

    def __setitem__(self, shard: int, entry: tuple[Identity, bytes]) -> None:
        self.pop(shard)
        self._known[shard] = entry
        self.held += len(entry[1])
        while self.held > self.budget_bytes and len(self._known) > 1:
            self.held -= len(self._known.popitem(last=False)[1][1])

    def pop(self, shard: int) -> None:
        entry = self._known.pop(shard, None)
        if entry is not None:
            self.held -= len(entry[1])


class DeferredReads:
    """ShardFiles' deferred reads (a mixin over ShardFiles' descriptors, LRU, indexes and pins)."""

    chunks_per_shard: int
    max_open: int
    tail: int
    _pins: threading.RLock
    _handles: OrderedDict[int, ShardHandle]
    _indexes: KnownIndexes
    _deferred: dict[int, set[ChunkRead]]

    if TYPE_CHECKING:  # ShardFiles' own, used here

        def _open(self, shard: int) -> tuple[int, Identity]: ...

        def _close(self, fd: int) -> None: ...

        def _retire(self, handle: ShardHandle) -> None: ...

        def _read_index(self, fd: int, shard: int, identity: Identity) -> bytes: ...

        def _read_open(self, reads: list[ChunkRead]) -> None: ...

        def release(self, reads: list[ChunkRead]) -> None: ...

    def before_replace(self, shard: int) -> None:
        """The writer of this process is about to rename a new file over ``shard`` (under the
        store's lock): deferred reads of ``shard`` get a descriptor of the file in place now, the
        version they were planned on."""
        with self._pins:
            waiting = self._deferred.pop(shard, None)
            if not waiting:
                return
            handle = self._handles.get(shard)
            if handle is None:
                fd, identity = self._open(shard)
                handle = ShardHandle(fd, b"", identity[3] - self.tail)
                handle.retired = True  # closed by the last of these reads (the writer drops the shard next)
                mine = [r for r in waiting if r.identity == identity]
                if len(mine) < len(waiting):  # planned on another version: left to ``read`` (``_relocate``)
                    self._deferred[shard] = waiting.difference(mine)
                if not mine:
                    self._close(fd)
                    return
            else:
                mine = list(waiting)
            handle.pins += len(mine)
            for r in mine:
                r.handle = handle

    def _read_deferred(self, reads: list[ChunkRead]) -> None:
        """Read deferred ``reads`` a shard at a time: the file opened, checked to be the version the
        reads were located in, read, and closed (or kept open, if there is room) before the next."""
        groups: dict[int, list[ChunkRead]] = {}
        for r in reads:
            groups.setdefault(r.cid // self.chunks_per_shard, []).append(r)
        for shard, group in groups.items():
            fd, identity = self._open(shard)
            with self._pins:
                mine = [r for r in group if r.handle is None]  # the others: given the old file by ``before_replace``
                waiting = self._deferred.get(shard)
                if waiting is not None:
                    waiting.difference_update(mine)
                    if not waiting:
                        del self._deferred[shard]
                same = [r for r in mine if r.identity == identity]
                if same:
                    handle = ShardHandle(fd, b"", identity[3] - self.tail)
                    handle.pins = len(same)
                    for r in same:
                        r.handle = handle
                    seen = self._indexes.get(shard)
                    handles = self._handles
                    if (seen is not None and seen[0] == identity and shard not in handles
                            and (len(handles) < self.max_open or (handles and handles[next(iter(handles))].pins == 0))):
                        handle.index = seen[1]  # kept open: later plans read the shard directly
                        handles[shard] = handle
                        if len(handles) > self.max_open:
                            self._retire(handles.popitem(last=False)[1])  # (no read needs it: closed)
                    else:
                        handle.retired = True
            other = [r for r in mine if r.identity != identity]
            if other:  # a writer in another process replaced the file: read it by its own index
                self._relocate(shard, *(self._open(shard) if same else (fd, identity)), other)
            elif not same:
                self._close(fd)
            try:
                self._read_open(group)
            finally:
                self.release(group)

    def _relocate(self, shard: int, fd: int, identity: Identity, reads: list[ChunkRead]) -> None:
        """Point ``reads`` at their chunks in the file open at ``fd`` (not the version they were located
        in), through that file's own index."""
        try:
            index = self._read_index(fd, shard, identity)
        except BaseException:
            self._close(fd)
            raise
        handle = ShardHandle(fd, index, identity[3] - self.tail)
        handle.retired = True
        with self._pins:
            handle.pins = len(reads)
            for r in reads:
                r.handle = handle
        for r in reads:
            off, nbytes = INDEX_ENTRY.unpack_from(index, INDEX_ENTRY_BYTES * (r.cid % self.chunks_per_shard))
            if off == EMPTY_OFFSET or off + nbytes > handle.size or nbytes < CRC_BYTES:
                raise ChunkChecksumError(
                    f"chunk {r.cid % self.chunks_per_shard} of shard {shard} of '{NAME}' was rewritten by another "
                    "process while it was being read and is now missing or damaged: reopen the store (or call "
                    "refresh()) and sample again", array=NAME, shard=shard, chunk=r.cid % self.chunks_per_shard)
            r.offset, r.nbytes = off, nbytes

    def _learn(self, shard: int) -> tuple[Identity, bytes]:
        """``shard``'s identity and index, read from its file, which is closed again (a deferred read:
        ``locate`` may hold no more descriptors)."""
        fd, identity = self._open(shard)
        try:
            entry = self._indexes[shard] = (identity, self._read_index(fd, shard, identity))
        finally:
            self._close(fd)
        return entry
