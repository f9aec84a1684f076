"""The write path of a stream on object storage: storage/writer.py's buffer and commit order, with
shards written as new objects and the commit a compare-and-swap of the stream's state object
(storage/objectstreams.py).

Each flush writes its shards under the keys of a new generation (create-only puts), then commits
the state object that names them; the objects they replace are listed as superseded in that
commit, and deleted by a commit ``gc_grace`` seconds later. A flush that fails part-way leaves the
store at its last commit: the objects it wrote are named by the next commit that succeeds (or
collected as orphans by the next writer of the stream).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replaystore.errors import CorruptStoreError
from replaystore.format.schema import Layout, Schema, State
from replaystore.storage.objectstreams import ARRAYS, ObjectStreams
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.writer import Writer


class ObjectWriter(Writer):
    """A ``Writer`` whose shards are objects named by generation and whose commit is a swap."""

    def __init__(self, streams: ObjectStreams, schema: Schema, layout: Layout, ring: Ring, reader: FrameReader,
                 committed: State, *, stream: int, base_shard: int) -> None:
        self.objects = streams
        doc = streams.owned[stream]
        self.names: dict[str, list[str | None]] = {name: list(doc.objects[name]) for name in ARRAYS}
        self.superseded: list[str] = []
        self.suffix: str | None = None  # the generation of the flush under way
        super().__init__(Path(), schema, layout, ring, reader, {}, committed, stream=stream, base_shard=base_shard)

    def flush(self) -> None:
        self.suffix = None  # a new generation for whatever this flush writes
        super().flush()

    def commit(self, state: State) -> None:
        self.objects.commit(self.stream, state, self.names, self.superseded)
        self.superseded = []
        self.committed = state

    def _load(self, name: str, shard: int) -> bytes | None:
        key = self.objects.key(name, self.stream, shard, self.names[name][shard])
        if key is None:
            return None
        got = self.objects.bucket.get(key)
        if got is None:
            raise CorruptStoreError(f"{self.objects.bucket.where(key)}, named by stream {self.stream}'s commit, is "
                                    "missing; the store is damaged")
        return got[0]

    def _store(self, name: str, shard: int, data: bytes, dirs: set[Any]) -> None:
        if self.suffix is None:
            self.suffix = self.objects.next_generation(self.stream)
        key = self.objects.key(name, self.stream, shard, self.suffix)
        assert key is not None
        self.objects.bucket.put_new(key, data)
        old = self.objects.key(name, self.stream, shard, self.names[name][shard])
        if old is not None and old != key:
            self.superseded.append(old)
        self.names[name][shard] = self.suffix
        if name == "obs":
            self.reader.files.set_key(self.base_shard + shard, key)
