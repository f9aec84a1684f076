"""The frame array's shard files as the read path sees them (``FrameShards`` of a local store): each
chunk's verified compressed bytes, read through descriptors kept open with their parsed shard index.

A shard's index is read once, when its file is opened, and kept with the open descriptor; a chunk is
then one ``pread``, checked against its crc32c. At most ``max_open`` files stay open (least
recently used closed first).

Reads happen in two steps so that the disk is never touched under the store's lock: ``locate``
(under the lock) finds a chunk's byte range and pins its open file; ``read`` (no lock) reads and
verifies the bytes and unpins. A file retired meanwhile (evicted, or its shard rewritten by the
writer) stays open until its last pinned read is done, so a read always sees the file version it
was planned on: never a shard newer than the commit the batch was planned at.

Consistency for readers in other processes: the index and the chunk bytes of a shard always come
from the same open file (a rewritten shard is a new file renamed over the old, so an open descriptor
keeps the old, whole version). The writing process drops a shard's descriptor whenever it rewrites
it (``forget``). A read-only store calls ``keep()`` when it opens: every frame shard file is opened
then and kept open, so however far a writer in another process moves on (and wraps the ring), the
reader keeps reading the files of the commit it opened at (up to ``snapshot_limit()`` shards: a
quarter of the process's descriptor limit, at most 4,096, 16M steps at the default layout; a bigger
store opens shards lazily, and a reader that outlives a whole lap of the writer can then read newer
frames: reopen such readers). Keeping them open is what makes out-of-core sampling fast: a miss on a
shard that is not open costs an ``open``, ``fstat`` and ``close`` besides its read (measured on a
5M-step store of 1,221 shards with a 1/10 cache, all open against 128 open: ~1.3x the batches on
one sampling thread, ~2x through the prefetcher; docs/benchmarks.md).

Descriptors stay bounded by ``max_open`` whatever a plan spans: a prefetcher block of 32 batches
touches ~1,000 shards, and pinning a file for each ran out of descriptors under the usual limit of
1,024. Once every descriptor the store may hold is pinned, ``locate`` *defers* the read: it takes
the chunk's range from the shard's known index, and ``read`` opens the file, checks it is that
version and reads it a shard at a time (deferred.py, which also covers a writer renaming a new file
over the shard in between). Deferring is not the default for a shard that is merely closed: opening
it under the store's lock measured faster with 2 sampling threads, since each ``open``, ``fstat``
and ``close`` outside the lock hands the GIL to the other thread and back.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replaystore.errors import ChunkChecksumError, TooManyOpenFilesError
from replaystore.format.shards import (
    CRC_BYTES,
    EMPTY_OFFSET,
    INDEX_ENTRY,
    INDEX_ENTRY_BYTES,
    parse_index,
    shard_key,
)
from replaystore.storage.backend import FRAMES, FrameShards, Whole
from replaystore.storage.chunkread import ChunkRead
from replaystore.storage.local.deferred import DeferredReads, Identity, KnownIndexes, ShardHandle
from replaystore.storage.readfile import NotAFileError, read_file

log = logging.getLogger(__name__)

MAX_OPEN_SHARDS = 128
SNAPSHOT_MAX_SHARDS = 4096  # file descriptors a read-only store may keep open, at most (a 16M-step Atari store)
NAME = FRAMES


class ShardFiles(DeferredReads, FrameShards):
    """Verified chunk bytes of the ``obs`` array's shard files under ``root``."""

    def __init__(self, root: Path, *, ndim: int, capacity: int, shard_len: int, chunk_len: int) -> None:
        FrameShards.__init__(self, ndim=ndim, capacity=capacity, shard_len=shard_len, chunk_len=chunk_len)
        self.root = root
        self.cap = 1 << 31  # the most bytes a shard read whole may hold (read_file refuses a larger one)
        self.max_open = lazy_limit()
        self._handles: OrderedDict[int, ShardHandle] = OrderedDict()
        self._pins = threading.RLock()  # guards pins, retired and closing (reads finish outside the store's lock)
        self._indexes = KnownIndexes()  # shard -> (the file's identity, its index), the recent ones
        self._deferred: dict[int, set[ChunkRead]] = {}  # shard -> reads located but not opened yet
        self._paths: dict[int, str] = {}
        self._fds = 0  # descriptors open now: handles in ``_handles`` and retired ones still pinned

    @property
    def open_files(self) -> int:
        """Descriptors this object holds now (retired handles still pinned included)."""
        return self._fds

    def locate(self, cids: list[int], generations: list[int]) -> list[ChunkRead | None]:
        """Where each of global chunks ``cids`` is, with its file pinned until ``read``; None for a
        chunk never written (all fill value). ``generations`` are the shards' (chunkcache.py).
        Called under the store's lock; opens (and reads the index of) shards not open. Where every
        descriptor the store may hold is pinned by reads in flight, the read is *deferred* instead
        (see the module docstring), so that no plan, however many shards it spans, holds more than
        ``max_open`` descriptors."""
        out: list[ChunkRead | None] = []
        per_shard, handles, entry = self.chunks_per_shard, self._handles, INDEX_ENTRY.unpack_from
        with self._pins:  # each handle pinned as soon as it is taken: opening the next may evict it
            for cid in cids:
                shard, chunk = divmod(cid, per_shard)
                handle = handles.get(shard)
                seen = None
                if handle is not None:
                    handles.move_to_end(shard)
                    index, limit = handle.index, handle.size
                elif self._fds < self.max_open or (handles and handles[next(iter(handles))].pins == 0):
                    handle = self._handle(shard)  # (evicting, and so closing, a handle no read needs)
                    index, limit = handle.index, handle.size
                else:
                    seen = self._indexes.get(shard) or self._learn(shard)
                    index, limit = seen[1], seen[0][3] - self.tail
                off, nbytes = entry(index, INDEX_ENTRY_BYTES * chunk)
                if off == EMPTY_OFFSET:
                    out.append(None)
                    continue
                if off + nbytes > limit or nbytes < CRC_BYTES:
                    first_slot = cid * self.chunk_len
                    raise ChunkChecksumError(
                        f"chunk {chunk} of shard {shard} of '{NAME}' (slots {first_slot}..{first_slot + self.chunk_len - 1}) "
                        "points outside its shard file; the store is damaged: run `replaystore verify`",
                        array=NAME, shard=shard, chunk=chunk,
                    )
                if handle is None:
                    assert seen is not None
                    r = ChunkRead(cid, None, off, nbytes, generations[shard], seen[0])
                    self._deferred.setdefault(shard, set()).add(r)
                else:
                    r = ChunkRead(cid, handle, off, nbytes, generations[shard])
                    handle.pins += 1
                out.append(r)
        return out

    def read(self, reads: list[ChunkRead]) -> None:
        """Read and verify each of ``reads`` (no lock of the store needed) and unpin its file. With
        several, the kernel is first told about all of them, so reads that miss the page cache are
        issued together instead of one after another. Deferred reads are read a shard at a time,
        each file open only while its chunks are read."""
        reads = [r for r in reads if not r.done]
        try:
            later = [r for r in reads if r.identity is not None]
            if not later:
                self._read_open(reads)
                return
            ready = [r for r in reads if r.identity is None]
            self._read_open(ready)
            self.release(ready)  # their files are free to be closed before the deferred ones are opened
            self._read_deferred(later)
        finally:
            self.release(reads)  # every read done (or given up after an error): unpin, at once

    def _read_open(self, reads: list[ChunkRead]) -> None:
        if len(reads) > 1 and _WILLNEED is not None:  # the kernel reads all of them in parallel
            for r in reads:
                try:
                    _fadvise(r.handle.fd, r.offset, r.nbytes, _WILLNEED)
                except OSError:
                    break
        check = self.check
        for r in reads:
            r.take(_pread(r.handle.fd, r.nbytes, r.offset), check)

    def release(self, reads: list[ChunkRead]) -> None:
        """Mark ``reads`` done (read, or given up: a plan that failed) and unpin their files."""
        closing = []
        with self._pins:
            for r in reads:
                if not r.done:
                    r.done = True
                    handle = r.handle
                    if handle is None:  # deferred, never opened
                        waiting = self._deferred.get(r.cid // self.chunks_per_shard)
                        if waiting is not None:
                            waiting.discard(r)
                        continue
                    handle.pins -= 1
                    if handle.retired and handle.pins == 0:
                        closing.append(handle.fd)
        for fd in closing:
            self._close(fd)

    def wholes(self, shards: list[int]) -> Iterator[Whole | None]:
        return map(self._whole, shards)

    def _whole(self, shard: int) -> Whole | None:
        try:
            raw = memoryview(read_file(self.root / shard_key(NAME, shard, self.ndim), cap=self.cap,
                                       what="a shard of frames"))
        except (FileNotFoundError, IsADirectoryError, NotAFileError):
            return None
        index = parse_index(raw[max(0, len(raw) - self.tail):], self.chunks_per_shard, name=NAME, shard=shard)
        return raw[: max(0, len(raw) - self.tail)], index.tolist()

    def stored_bytes(self) -> int:
        return sum(self.file_bytes(shard) for shard in range(-(-self.capacity // self.shard_len)))

    def file_bytes(self, shard: int) -> int:
        """The size of ``shard``'s file on disk (0 if it does not exist)."""
        try:
            return (self.root / shard_key(NAME, shard, self.ndim)).stat().st_size
        except OSError:
            return 0

    def keep(self) -> bool:
        """Open every shard file now and keep them all open (see the module docstring); returns
        False, doing nothing, for a store of more shards than ``snapshot_limit()``."""
        n_shards = -(-self.capacity // self.shard_len)
        if n_shards > snapshot_limit():
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
                self.max_open = lazy_limit()
                while len(self._handles) > self.max_open:
                    self._retire(self._handles.popitem(last=False)[1])
                return False
        return True

    def forget(self, shard: int) -> None:
        """Let go of ``shard``'s file (the writer just rewrote it; the next read opens the new one)."""
        with self._pins:
            self._indexes.pop(shard)
            handle = self._handles.pop(shard, None)
        if handle is not None:
            self._retire(handle)

    def close(self) -> None:
        with self._pins:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            self._retire(handle)

    def _retire(self, handle: ShardHandle) -> None:
        with self._pins:
            handle.retired = True
            if handle.pins:
                return  # the last read planned on it closes it
        self._close(handle.fd)

    def _handle(self, shard: int) -> ShardHandle:
        handle = self._handles.get(shard)
        if handle is not None:
            self._handles.move_to_end(shard)
            return handle
        fd, identity = self._open(shard)
        try:
            known = self._indexes.get(shard)
            if known is not None and known[0] == identity:
                index = known[1]
            else:
                index = self._read_index(fd, shard, identity)
                self._indexes[shard] = (identity, index)
        except BaseException:
            self._close(fd)
            raise
        handle = ShardHandle(fd, index, identity[3] - self.tail)
        with self._pins:
            self._handles[shard] = handle
            if len(self._handles) > self.max_open:
                self._retire(self._handles.popitem(last=False)[1])
        return handle

    def _open(self, shard: int) -> tuple[int, Identity]:
        """``shard``'s file opened read-only, and its identity (inode, device, mtime, size)."""
        path = self._paths.get(shard)
        if path is None:
            path = self._paths[shard] = str(self.root / shard_key(NAME, shard, self.ndim))
        try:
            fd = os.open(path, _O_READ)
        except FileNotFoundError:
            raise ChunkChecksumError(
                f"shard {shard} of '{NAME}' ({path}) is missing although the store's state says it holds live "
                "steps; the store is damaged: run `replaystore verify`",
                array=NAME, shard=shard, chunk=None,
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise TooManyOpenFilesError(exc.errno, _emfile_message(Path(path), exc)) from exc
            raise
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(st.st_mode):  # a directory or a device where a shard file should be
            os.close(fd)
            raise ChunkChecksumError(
                f"shard {shard} of '{NAME}' ({path}) is not a regular file; the store is damaged: run "
                "`replaystore verify`, and `replaystore compact --drop-damaged` to keep the rest",
                array=NAME, shard=shard, chunk=None,
            )
        with self._pins:
            self._fds += 1
        return fd, (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)

    def _close(self, fd: int) -> None:
        with self._pins:
            self._fds -= 1
        os.close(fd)

    def _read_index(self, fd: int, shard: int, identity: Identity) -> bytes:
        """The checked index of the shard file open at ``fd`` (its chunks' offsets and sizes)."""
        tail = _pread(fd, self.tail, max(0, identity[3] - self.tail))
        return parse_index(tail, self.chunks_per_shard, name=NAME, shard=shard).astype("<u8").tobytes()


def snapshot_limit() -> int:
    """Shard files a read-only store keeps open to read one commit however far a writer moves on:
    at most SNAPSHOT_MAX_SHARDS, and at most a quarter of this process's descriptor limit, so that a
    few open stores never exhaust it. A bigger store opens its shard files lazily instead."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return SNAPSHOT_MAX_SHARDS
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return SNAPSHOT_MAX_SHARDS
    return max(0, min(SNAPSHOT_MAX_SHARDS, soft // 4))


def lazy_limit() -> int:
    """Shard files a store keeps open when it does not keep them all (a writer, or a reader of more
    shards than ``snapshot_limit()``), least recently used closed first: half the snapshot limit,
    at least MAX_OPEN_SHARDS. Their indexes stay known either way (16 bytes a chunk)."""
    return max(MAX_OPEN_SHARDS, snapshot_limit() // 2)


def _emfile_message(path: Path, exc: OSError) -> str:
    try:
        import resource

        limit = f"the limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    except (ImportError, OSError, ValueError):
        limit = "the limit was reached"
    return (f"cannot open {path}: this process has too many open files ({exc.strerror}; {limit}); close replay "
            "stores you no longer use (store.close(), or open them in a `with` block), or raise the limit "
            "(`ulimit -n`, or resource.setrlimit(RLIMIT_NOFILE, ...))")


def _pread_fallback(fd: int, n: int, offset: int) -> bytes:
    """``os.pread`` where the platform lacks it (one read at a time: the descriptor's offset is shared)."""
    with _SEEK_LOCK:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, n)


_SEEK_LOCK = threading.Lock()
_pread = getattr(os, "pread", None) or _pread_fallback
_fadvise: Any = getattr(os, "posix_fadvise", None)
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None) if _fadvise is not None else None
_O_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # (a FIFO in a shard's place: no blocking)
