"""One chunk to read outside the store's lock: what ``FrameShards.locate`` hands the reader, and what
``read`` fills in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import google_crc32c

from replaystore.format.shards import CRC_BYTES

_crc = google_crc32c.value


class ChunkRead:
    """Where one chunk's bytes are (``handle``: the backend's: an open file, an object) and, once read,
    its verified payload. ``generation`` is its shard's when planned (see chunkcache.py)."""

    __slots__ = ("cid", "handle", "offset", "nbytes", "generation", "payload", "done", "identity")

    def __init__(self, cid: int, handle: Any, offset: int, nbytes: int, generation: int,
                 identity: tuple[int, int, int, int] | None = None) -> None:
        self.cid = cid
        self.handle = handle  # None: a deferred read, its file opened by ``read`` (storage/local/deferred.py)
        self.offset = offset
        self.nbytes = nbytes
        self.generation = generation
        self.payload: bytes | None = None
        self.done = False
        self.identity = identity  # a deferred read's: the file version ``offset`` and ``nbytes`` come from

    def take(self, raw: bytes, check: Callable[[bytes, int], bytes]) -> None:
        """Keep ``raw`` (the chunk's stored bytes) as the payload once its crc32c matches, else
        ``check(raw, cid)`` raises the error that names the chunk."""
        payload = raw[:-CRC_BYTES]
        if len(raw) != self.nbytes or _crc(payload) != int.from_bytes(raw[-CRC_BYTES:], "little"):
            payload = check(raw, self.cid)
        self.payload = payload
