"""What the read path hands around: an open shard file with its parsed index, and one chunk to read."""

from __future__ import annotations


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


class ChunkRead:
    """One chunk to read outside the store's lock: where its bytes are, in a pinned file, and (once
    read) its verified payload. ``generation`` is its shard's when planned (see chunkcache.py)."""

    __slots__ = ("cid", "handle", "offset", "nbytes", "generation", "payload", "done", "identity")

    def __init__(self, cid: int, handle: ShardHandle | None, offset: int, nbytes: int, generation: int,
                 identity: tuple[int, int, int, int] | None = None) -> None:
        self.cid = cid
        self.handle = handle  # None: a deferred read, its file opened by ``read`` (or ``before_replace``)
        self.offset = offset
        self.nbytes = nbytes
        self.generation = generation
        self.payload: bytes | None = None
        self.done = False
        self.identity = identity  # a deferred read's: the file version ``offset`` and ``nbytes`` come from
