"""The write path of one stream: the frame shard being filled, whole-shard writes, and the commit.

Frames are written once, into ``frames`` (openshard.py: the shard being filled, its chunks encoded as
the writer moves past them, one chunk raw). When a step falls outside that shard, or on ``flush()``,
the shard is written *whole* (zarr shards are never updated in part) together with the scalar shards
that changed, and then the stream's state is committed. A partial shard that was flushed is
rewritten whole when it fills up. When the writer moves onto a shard that already exists (the ring
wrapped, or a reopened store continues a flushed partial shard), it first loads that shard, so the
tail of older live steps is written back unchanged.

Commit order, through the backend (storage/backend.py: renames on a file system, new objects and a
compare-and-swap on object storage):

1. if the new data overwrites slots the committed state calls live, commit a state whose ``oldest``
   has moved past them (the live range only shrinks), then
2. write the frame shard and the dirty scalar shards (priorities too: they need no ordering), then
3. commit the new ``added``.

A crash at any instant therefore leaves a committed state whose live steps are all whole in storage.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from typing import Any

import numpy as np

from replaystore.format.schema import Layout, Schema, State, scalar_fields
from replaystore.format.shards import encode_shard
from replaystore.storage.backend import FRAMES, Backend
from replaystore.storage.encoders import ChunkCodec
from replaystore.storage.openshard import OpenShard
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring


class ShardWriter:
    """Stream ``stream``'s open frame shard, its shard writes and its commits. ``ring`` is the
    stream's; ``reader`` serves frames of the open shard and forgets a shard the writer rewrites."""

    def __init__(self, backend: Backend, schema: Schema, layout: Layout, ring: Ring, reader: FrameReader,
                 committed: State, *, stream: int) -> None:
        self.backend = backend
        self.layout = layout
        self.ring = ring
        self.reader = reader
        self.committed = committed
        self.stream = stream
        self.codec = ChunkCodec(layout.codec)  # libzstd with a kept context where it can (encoders.py)
        self.episodes = committed.episodes
        obs = schema.observation
        self.frames = OpenShard(obs.shape, obs.dtype, chunk_len=layout.obs_chunk_len,
                               n_chunks=layout.shard_len // layout.obs_chunk_len, codec=self.codec)
        self.region = -1
        self.region_dirty = False
        # one shard of each field as stored (the ring's columns may be narrower: columns.py)
        self._scalar_buffer = {name: np.zeros((layout.shard_len, *shape), dtype=dtype)
                               for name, (shape, dtype) in scalar_fields(schema.action, schema.extras).items()}
        self.enter_region((ring.added % ring.capacity) // layout.shard_len)

    # ---------------------------------------------------------------------------------------------
    # Frames

    def live_region(self) -> tuple[int, OpenShard] | None:
        """The array's shard being filled (global shard number) and its frames."""
        return (self.backend.shard_of(self.stream, self.region), self.frames) if self.region >= 0 else None

    def put_frame(self, position: int, obs: np.ndarray) -> None:
        """Write the observation of step ``position`` (= ring.added, before append_step)."""
        slot = position % self.ring.capacity
        shard = slot // self.layout.shard_len
        if shard != self.region:
            self.flush()
            self.enter_region(shard)
        row = slot - shard * self.layout.shard_len
        if row // self.layout.obs_chunk_len != self.frames.open_index:
            self.reader.opening(self.backend.shard_of(self.stream, shard), row // self.layout.obs_chunk_len)
        self.frames.put(row, obs)
        self.region_dirty = True

    def ready(self, positions: list[int]) -> bool:
        """Before frames are put at ``positions`` (in order): whether that writes to storage (one falls
        outside the shard being filled: the caller prepares an undo). If not, the one thing that can
        still fail, a stored chunk that does not decode, fails here, before anything has changed: a
        later position's chunk is checked, then the first one's is opened."""
        cap, shard_len, chunk_len = self.ring.capacity, self.layout.shard_len, self.layout.obs_chunk_len
        start = self.region * shard_len
        chunks = []
        for p in positions:
            row = p % cap - start
            if not 0 <= row < shard_len:
                return True
            chunks.append(row // chunk_len)
        first = chunks[0]
        if first == self.frames.open_index and chunks[-1] == first:  # the common case: nothing to open
            return False
        for c in chunks[1:]:
            if c != first:
                self.frames.check(c)
        if first != self.frames.open_index:
            self.frames.open_chunk(first)
            self.reader.opening(self.backend.shard_of(self.stream, self.region), first)
        return False

    def undo_point(self, positions: list[int]) -> Callable[[], None]:
        """A function that puts the open shard and the counters back as they are now, after putting
        frames at ``positions`` failed part-way (a write error in the commit it caused)."""
        region, dirty, episodes, committed = self.region, self.region_dirty, self.episodes, self.committed
        kept = self.frames.snapshot()

        def undo() -> None:
            self.frames.restore(kept)
            self.region, self.region_dirty, self.episodes, self.committed = region, dirty, episodes, committed
            self.reader.invalidate(self.backend.shard_of(self.stream, region))

        return undo

    def enter_region(self, shard: int) -> None:
        """Start filling the stream's ``shard``, loading what is stored there (older live steps)."""
        raw = self.backend.read_shards([(FRAMES, self.stream, shard)])[0]
        if raw is not None:
            self.frames.load(raw, name=FRAMES, shard=self.backend.shard_of(self.stream, shard))
        else:
            self.frames.reset(name=FRAMES, shard=self.backend.shard_of(self.stream, shard))
        self.region = shard
        self.region_dirty = False
        self.reader.invalidate(self.backend.shard_of(self.stream, shard))

    # ---------------------------------------------------------------------------------------------
    # Commit

    def state(self) -> State:
        ring = self.ring
        in_progress = ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])
        return State(added=ring.added, oldest=ring.lo, episode_in_progress=in_progress, episodes=self.episodes,
                     updated=now())

    def flush(self) -> None:
        """Make everything added so far durable, then commit it."""
        ring = self.ring
        if (ring.added == self.committed.added and not self.region_dirty and not ring.dirty_shards
                and not ring.dirty_priority_shards):
            return
        new_lo = ring.lo
        if new_lo > self.committed.live_start(ring.capacity):
            self.commit(dataclasses.replace(self.committed, oldest=new_lo, updated=now()))
        if self.region_dirty:
            self._write_obs_shard()
        for shard in sorted(ring.dirty_shards):
            self._write_scalar_shard(shard, ring.fields)
        priority_only = {"priority": ring.priority}
        for shard in sorted(ring.dirty_priority_shards - ring.dirty_shards):
            self._write_scalar_shard(shard, priority_only)
        ring.dirty_shards.clear()
        ring.dirty_priority_shards.clear()
        self.commit(self.state())

    def commit(self, state: State) -> None:
        self.backend.commit(self.stream, state)
        self.committed = state

    def _rows(self, shard: int) -> int:
        return min(self.layout.shard_len, self.ring.capacity - shard * self.layout.shard_len)

    def _write_obs_shard(self) -> None:
        shard = self.region
        data = self.frames.encode(self._rows(shard))
        self.backend.write_shard(FRAMES, self.stream, shard, data)
        self.reader.invalidate(self.backend.shard_of(self.stream, shard))
        self.region_dirty = False

    def _write_scalar_shard(self, shard: int, fields: dict[str, Any]) -> None:
        start = shard * self.layout.shard_len
        rows = self._rows(shard)
        for name, values in fields.items():
            buf = self._scalar_buffer[name]
            buf[:rows] = values[start : start + rows]
            buf[rows:] = 0
            data = encode_shard(buf, chunk_len=self.layout.shard_len, rows=rows, codec=self.codec)
            self.backend.write_shard(name, self.stream, shard, data)


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
