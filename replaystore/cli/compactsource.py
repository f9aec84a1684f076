"""What ``compact`` reads: the store being compacted, on local disk (under every stream's writer
lock) or on object storage (a snapshot of its commits), as one interface: its schema, its streams'
states and scalar rings, its frames, its size."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.cli.summary import disk_bytes
from replaystore.cli.verify import verify_store
from replaystore.errors import ChunkChecksumError, CorruptStoreError
from replaystore.format.schema import Layout, Schema, State, from_attrs, stream_stride
from replaystore.format.shards import decode_shard, numcodecs_codec, shard_key
from replaystore.format.validate import read_group_doc
from replaystore.storage.commits import read_stream_state
from replaystore.storage.lock import WriterLock
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.writer import stream_dir
from replaystore.store import ReplayStore


class Source(ABC):
    """The store being compacted: its schema, its streams' states and rings, its frames."""

    schema: Schema
    layout: Layout
    states: list[State]

    def hold(self) -> None:
        """Keep writers from changing what is compacted (local: every stream's writer lock)."""

    @abstractmethod
    def verify(self, progress: Callable[[int, int], None] | None) -> Any:
        """The source verified (``verify_store``'s report)."""

    @abstractmethod
    def ring(self, k: int) -> Ring:
        """Stream ``k``'s scalars, as of its commit."""

    @abstractmethod
    def reader(self) -> FrameReader:
        """A frame reader of the source's shards."""

    @abstractmethod
    def nbytes(self) -> int:
        """The source's bytes on its storage."""

    def close(self) -> None:
        pass


class LocalSource(Source):
    """A store on local disk, compacted under every stream's writer lock."""

    def __init__(self, root: Path) -> None:
        self.root = root
        doc = read_group_doc(root)
        self.schema, self.layout, self.state = from_attrs(doc.get("attributes"), path=str(root))
        n = self.schema.num_streams
        self.locks = [WriterLock(root)] if n == 1 else [WriterLock(stream_dir(root, k), f"stream {k} of {root}")
                                                       for k in range(n)]
        self.held: list[WriterLock] = []
        self._reader: FrameReader | None = None

    def hold(self) -> None:
        for lock in self.locks:
            lock.acquire()
            self.held.append(lock)

    def verify(self, progress: Callable[[int, int], None] | None) -> Any:
        report = verify_store(self.root, progress=progress)
        if not any(p.array == "metadata" for p in report.problems):
            n = self.schema.num_streams
            self.states = [self.state] if n == 1 else [read_stream_state(self.root, k) for k in range(n)]
        return report

    def ring(self, k: int) -> Ring:
        base_shard = k * stream_stride(self.schema, self.layout) // self.layout.shard_len
        ring = _load_scalars(self.root, self.schema, self.layout, self.states[k], base_shard)
        ring.rebuild_valid()
        return ring

    def reader(self) -> FrameReader:
        # Source frames are read by the store's slot (stream k's position p is slot k*stride + p % capacity).
        self._reader = FrameReader(self.root, self.schema, self.layout, cache_bytes=0)
        return self._reader

    def nbytes(self) -> int:
        return sum(disk_bytes(self.root).values())

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        for lock in reversed(self.held):
            lock.release()


class ObjectSource(Source):
    """A store on object storage, compacted as of the commits it reads (a snapshot: its shard objects
    never change, so writers may go on meanwhile; what they commit later is not in the copy)."""

    def __init__(self, url: str) -> None:
        from replaystore.storage.objectopen import read_root
        from replaystore.storage.objects import Bucket

        self.url = url
        _, self.schema, self.layout = read_root(Bucket(url))
        self.store: ReplayStore | None = None
        self._reader: FrameReader | None = None

    def verify(self, progress: Callable[[int, int], None] | None) -> Any:
        self.store = ReplayStore.open(self.url, cache_bytes=0)
        self.states = self.store.stream_states()
        report = verify_store(self.url, progress=progress)
        now = [self.store._read_state(k) for k in range(self.schema.num_streams)]
        if report.problems and [(s.added, s.oldest) for s in now] != [(s.added, s.oldest) for s in self.states]:
            raise CorruptStoreError(f"{self.url} changed while it was verified, so its damage cannot be placed in the "
                                    "copy; stop its writers and run compact again")
        return report

    def ring(self, k: int) -> Ring:
        assert self.store is not None
        src = self.store.rings.streams[k]
        ring = Ring(src.capacity, src.frame_stack, src.shard_len)
        for name, values in src.fields.items():
            ring.fields[name][:] = values
        ring.added, ring.oldest = src.added, src.oldest
        ring.rebuild_valid()
        return ring

    def reader(self) -> FrameReader:
        """Frames by the store's slot (the store's own reader takes positions of its streams), from
        the shard objects of the commits opened."""
        assert self.store is not None and self.store.objects is not None
        self._reader = FrameReader(Path(self.url), self.schema, self.layout, cache_bytes=0,
                                   bucket=self.store.objects.bucket)
        for shard, key in self.store.reader.files.keys.items():  # type: ignore[attr-defined]
            self._reader.files.set_key(shard, key)  # type: ignore[attr-defined]
        return self._reader

    def nbytes(self) -> int:
        assert self.store is not None
        return store_bytes(self.store)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self.store is not None:
            self.store.close()


def store_bytes(store: ReplayStore) -> int:
    """The bytes a store's current commits use, on disk or on object storage."""
    if store.objects is not None:
        from replaystore.cli.summary import object_bytes

        return sum(object_bytes(store.objects).values())
    return sum(disk_bytes(store.path).values())


def _load_scalars(root: Path, schema: Schema, layout: Layout, state: State, base_shard: int) -> Ring:
    """One stream's scalar arrays (its shard ``j`` is the arrays' ``base_shard + j``), with damaged
    shards left as zeros (verify has named their slots)."""
    capacity = schema.stream_capacity
    ring = Ring(capacity, schema.frame_stack, layout.shard_len)
    ring.added, ring.oldest = state.added, state.oldest
    codec = numcodecs_codec(layout.codec)
    n_shards = -(-capacity // layout.shard_len)
    for name, values in ring.fields.items():
        out = np.zeros(layout.shard_len, dtype=values.dtype)
        for shard in range(n_shards):
            start = shard * layout.shard_len
            rows = min(layout.shard_len, capacity - start)
            try:
                decode_shard((root / shard_key(name, base_shard + shard, 0)).read_bytes(), chunk_len=layout.shard_len,
                             n_chunks=1, codec=codec, out=out, name=name, shard=base_shard + shard)
            except (FileNotFoundError, ChunkChecksumError):
                out[:] = 0
            values[start : start + rows] = out[:rows]
    return ring
