"""What ``compact`` reads: the store being compacted, through its backend, as one commit of every
stream: its schema, its streams' states and scalar rings (damaged shards read as zeros, once
``verify`` has named their slots), its frames and its size.

Where a reader's view does not stay whole while writers go on (a local store: files are replaced),
compaction holds every stream's writer claim for the whole run, so nothing is appended meanwhile
and an in-place swap loses nothing. On object storage the commits read are a snapshot (their
objects never change), so writers may go on: what they commit later is not in the copy.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from replaystore.cli.verify import Report, verify_store
from replaystore.errors import LockUnavailableError
from replaystore.format.schema import State, scalar_fields
from replaystore.storage.choose import open_backend
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.scalars import load_scalars


class Source:
    """The store at ``path``, as compact reads it."""

    def __init__(self, path: str | Path) -> None:
        self.backend = open_backend(path)
        self.schema, self.layout = self.backend.read_metadata(check_arrays=False)  # (verify checks them)
        self.states: list[State] = []
        self._reader: FrameReader | None = None

    def hold(self, *, in_place: bool) -> None:
        """Keep writers from changing what is compacted, where they could. Compacting into a new
        DST only reads the source: a source this process cannot write (a read-only directory or
        file system, where no lock can be created) is read without its locks."""
        if not self.backend.views_are_snapshots:
            for k in range(self.schema.num_streams):
                try:
                    self.backend.claim(k)
                except LockUnavailableError as exc:
                    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                        raise
                    if in_place:
                        raise LockUnavailableError(exc.errno, f"cannot compact {self.backend.where} in place: this "
                                                   "process cannot write it; compact it into a new DST "
                                                   f"(replaystore compact {self.backend.where} DST), which only "
                                                   "reads it") from None

    def verify(self, progress: Callable[[int, int], None] | None) -> Report:
        """The source verified; the commits it checked are the ones compacted (``states``)."""
        report = verify_store(self.backend, progress=progress)
        self.states = report.states or []
        return report

    def ring(self, k: int) -> Ring:
        """Stream ``k``'s scalars, as of its commit verified."""
        ring = Ring(self.schema.stream_capacity, self.schema.frame_stack, self.layout.shard_len,
                    dict(scalar_fields(self.schema.action, self.schema.extras)))
        ring.added, ring.oldest = self.states[k].added, self.states[k].oldest
        load_scalars(self.backend, k, ring, self.layout, check=False, damaged_as_zero=True)
        ring.rebuild_valid()
        return ring

    def reader(self) -> FrameReader:
        """Frames by the store's slot (stream ``k``'s position ``p`` is slot ``k * stride + p % capacity``),
        as of the commits verified."""
        for k in range(self.schema.num_streams):
            self.backend.follow(k)
        self._reader = FrameReader(self.backend.frames, self.schema, self.layout, cache_bytes=0)
        return self._reader

    def nbytes(self) -> int:
        """The source's bytes in storage."""
        return sum(self.backend.stored_bytes().values())

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.backend.close()
