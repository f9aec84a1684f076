"""The write path: a RAM buffer of one frame shard, whole-shard writes, and the commit.

Frames are written once, into ``buffer`` (one shard, ``shard_len`` steps). When a step falls outside
the buffer's shard, or on ``flush()``, the buffer is encoded and written *whole* (zarr shards must
never be updated in part) together with the scalar shards that changed, and then the committed
state is written to the group's ``zarr.json``. A partial shard that was flushed is rewritten whole
when it fills up. When the buffer moves onto a shard that already exists on disk (the ring wrapped,
or a reopened store continues a flushed partial shard), it first loads that shard, so the tail of
older live steps is written back unchanged.

Commit order (every file is written to a temporary name, fsynced and renamed):

1. if the new data overwrites slots the committed state calls live, commit a state whose ``oldest``
   has moved past them (the live range only shrinks), then
2. write the frame shard and the dirty scalar shards (priorities too: they need no ordering), then
3. commit the new ``added``.

A crash at any instant therefore leaves a committed state whose live steps are all whole on disk.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import CorruptStoreError
from replaystore.format.schema import ATTR_KEY, STREAMS_DIR, Layout, Schema, State, stream_doc, to_attrs
from replaystore.format.shards import (
    atomic_write,
    decode_shard,
    encode_shard,
    fsync_dirs,
    numcodecs_codec,
    shard_key,
)
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.rings import SHIFT

log = logging.getLogger(__name__)


def write_group_json(root: Path, group_doc: dict[str, Any]) -> None:
    """Atomically replace ``root/zarr.json`` (the commit point)."""
    atomic_write(root / "zarr.json", json.dumps(group_doc, indent=2).encode())  # syncs root too


class Writer:
    """Owns the frame buffer, the scalar shard writes and the committed state of one stream (the
    only one of a one-stream store).

    ``ring`` is the stream's; its shard ``j`` is the arrays' shard ``base_shard + j`` (rings.py).
    ``group_doc`` is the document the commit rewrites: the store's ``zarr.json`` for one stream,
    ``streams/<k>/zarr.json`` (schema.stream_doc) for stream ``k`` of several."""

    def __init__(self, root: Path, schema: Schema, layout: Layout, ring: Ring, reader: FrameReader,
                 group_doc: dict[str, Any], committed: State, *, stream: int = 0, base_shard: int = 0) -> None:
        self.root = root
        self.schema = schema
        self.layout = layout
        self.ring = ring
        self.reader = reader
        self.group_doc = group_doc
        self.committed = committed
        self.stream = stream
        self.base_shard = base_shard
        self.streams = schema.num_streams > 1
        self.codec = numcodecs_codec(layout.codec)
        self.episodes = committed.episodes
        obs = schema.observation
        self.buffer = np.zeros((layout.shard_len, *obs.shape), dtype=obs.dtype)
        self.region = -1
        self.region_dirty = False
        self._item_ndim = len(obs.shape)
        self._scalar_buffer: dict[str, np.ndarray] = {}
        self.n_shards = -(-ring.capacity // layout.shard_len)
        self.enter_region((ring.added % ring.capacity) // layout.shard_len)

    # ---------------------------------------------------------------------------------------------
    # Frames

    def live_region(self) -> tuple[int, np.ndarray] | None:
        """The arrays' shard the buffer holds (global shard number) and the buffer."""
        return (self.base_shard + self.region, self.buffer) if self.region >= 0 else None

    def put_frame(self, position: int, obs: np.ndarray) -> None:
        """Write the observation of step ``position`` (= ring.added, before append_step)."""
        slot = position % self.ring.capacity
        shard = slot // self.layout.shard_len
        if shard != self.region:
            self.flush()
            self.enter_region(shard)
        self.buffer[slot - shard * self.layout.shard_len] = obs
        self.region_dirty = True

    def writes_for(self, positions: list[int]) -> bool:
        """Whether putting frames at ``positions`` (in order) writes to disk: one falls outside the shard
        the buffer holds."""
        shard_len, cap, region = self.layout.shard_len, self.ring.capacity, self.region
        for p in positions:
            if (p % cap) // shard_len != region:
                return True
        return False

    def undo_point(self, positions: list[int]) -> Callable[[], None]:
        """A function that puts the buffer, its shard and the counters back as they are now, after
        putting frames at ``positions`` failed part-way (a write error in the commit it caused)."""
        region, dirty, episodes, committed = self.region, self.region_dirty, self.episodes, self.committed
        shard_len, cap = self.layout.shard_len, self.ring.capacity
        rows = [p % cap - region * shard_len for p in positions if (p % cap) // shard_len == region]
        kept = self.buffer[rows].copy()

        def undo() -> None:
            if self.region != region:  # the shard was written and the buffer moved on: load it back
                self.enter_region(region)
            self.buffer[rows] = kept
            self.region_dirty, self.episodes, self.committed = dirty, episodes, committed

        return undo

    def frame_at(self, position: int) -> np.ndarray:
        g = self.stream << SHIFT | position if self.streams else position
        return np.array(self.reader.gather(np.array([g], dtype=np.int64))[0])

    def enter_region(self, shard: int) -> None:
        """Point the buffer at the stream's ``shard``, loading what is on disk there (older live steps)."""
        raw = self._load("obs", shard)
        if raw is not None:
            decode_shard(raw, chunk_len=self.layout.obs_chunk_len,
                         n_chunks=self.layout.shard_len // self.layout.obs_chunk_len,
                         codec=self.codec, out=self.buffer, name="obs", shard=self.base_shard + shard)
        else:
            self.buffer[...] = 0
        self.region = shard
        self.region_dirty = False
        self.reader.invalidate(self.base_shard + shard)

    # ---------------------------------------------------------------------------------------------
    # Commit

    def state(self) -> State:
        ring = self.ring
        in_progress = ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])
        return State(added=ring.added, oldest=ring.lo, episode_in_progress=in_progress, episodes=self.episodes,
                     updated=_now())

    def flush(self) -> None:
        """Make everything added so far durable, then commit it."""
        ring = self.ring
        if (ring.added == self.committed.added and not self.region_dirty and not ring.dirty_shards
                and not ring.dirty_priority_shards):
            return
        new_lo = ring.lo
        if new_lo > self.committed.live_start(ring.capacity):
            self.commit(dataclasses.replace(self.committed, oldest=new_lo, updated=_now()))
        dirs: set[Path] = set()  # directories files were renamed into: each synced once, before the commit
        if self.region_dirty:
            self._write_obs_shard(dirs)
        for shard in sorted(ring.dirty_shards):
            self._write_scalar_shard(shard, ring.fields, dirs)
        priority_only = {"priority": ring.priority}
        for shard in sorted(ring.dirty_priority_shards - ring.dirty_shards):
            self._write_scalar_shard(shard, priority_only, dirs)
        fsync_dirs(dirs)
        ring.dirty_shards.clear()
        ring.dirty_priority_shards.clear()
        self.commit(self.state())

    def commit(self, state: State) -> None:
        if self.streams:
            doc = stream_doc(self.stream, state)
            write_group_json(stream_dir(self.root, self.stream), doc)
        else:
            attrs = dict(self.group_doc.get("attributes") or {})
            attrs[ATTR_KEY] = to_attrs(self.schema, self.layout, state)
            doc = dict(self.group_doc)
            doc["attributes"] = attrs
            write_group_json(self.root, doc)
        self.group_doc = doc
        self.committed = state

    def _rows(self, shard: int) -> int:
        return min(self.layout.shard_len, self.ring.capacity - shard * self.layout.shard_len)

    def _write_obs_shard(self, dirs: set[Path]) -> None:
        shard = self.region
        data = encode_shard(self.buffer, chunk_len=self.layout.obs_chunk_len, rows=self._rows(shard), codec=self.codec)
        self._store("obs", shard, data, dirs)
        self.reader.invalidate(self.base_shard + shard)
        self.region_dirty = False

    def _write_scalar_shard(self, shard: int, fields: dict[str, np.ndarray], dirs: set[Path]) -> None:
        start = shard * self.layout.shard_len
        rows = self._rows(shard)
        for name, values in fields.items():
            buf = self._scalar_buffer.get(name)
            if buf is None:
                buf = self._scalar_buffer[name] = np.zeros(self.layout.shard_len, dtype=values.dtype)
            buf[:rows] = values[start : start + rows]
            buf[rows:] = 0
            data = encode_shard(buf, chunk_len=self.layout.shard_len, rows=rows, codec=self.codec)
            self._store(name, shard, data, dirs)

    # ---------------------------------------------------------------------------------------------
    # Where shards are kept (a store on object storage overrides these: storage/objectwriter.py)

    def _load(self, name: str, shard: int) -> bytes | None:
        """The stream's shard ``shard`` of array ``name`` as stored now, or None if never written."""
        path = self.root / shard_key(name, self.base_shard + shard, self._item_ndim if name == "obs" else 0)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _store(self, name: str, shard: int, data: bytes, dirs: set[Path]) -> None:
        """Write the stream's shard ``shard`` of array ``name`` whole (``dirs``: see ``atomic_write``)."""
        path = self.root / shard_key(name, self.base_shard + shard, self._item_ndim if name == "obs" else 0)
        if name == "obs":  # reads planned on the file in place keep reading it (shardfiles.py)
            self.reader.files.before_replace(self.base_shard + shard)
        atomic_write(path, data, dirs=dirs)


def stream_dir(root: Path, stream: int) -> Path:
    """Where stream ``stream`` of a store of streams keeps its commit and its writer lock."""
    return root / STREAMS_DIR / str(stream)


def load_scalars(root: Path | None, layout: Layout, ring: Ring, *, base_shard: int = 0,
                 shards: Iterable[int] | None = None, check: bool = True,
                 fetch: Callable[[str, int], bytes | None] | None = None) -> None:
    """Read a stream's scalar shards (default: all of them) into ``ring.fields`` (missing shards are
    all zero); its shard ``j`` is the arrays' ``base_shard + j``. ``fetch(name, j)``: the shard's
    bytes from somewhere other than the files under ``root`` (a store on object storage)."""
    codec = numcodecs_codec(layout.codec)
    n_shards = -(-ring.capacity // layout.shard_len)
    buf: dict[str, np.ndarray] = {}
    for name, values in ring.fields.items():
        out = buf.setdefault(name, np.zeros(layout.shard_len, dtype=values.dtype))
        for shard in (range(n_shards) if shards is None else shards):
            start = shard * layout.shard_len
            rows = min(layout.shard_len, ring.capacity - start)
            raw = fetch(name, shard) if fetch is not None else _read_or_none(root / shard_key(name, base_shard + shard, 0))
            if raw is None:
                values[start : start + rows] = 0
                continue
            decode_shard(raw, chunk_len=layout.shard_len, n_chunks=1, codec=codec, out=out, name=name,
                         shard=base_shard + shard)
            values[start : start + rows] = out[:rows]
    if check:
        _check_scalars(ring, root)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _check_scalars(ring: Ring, root: Path | None) -> None:
    lo, added = ring.lo, ring.added
    positions = np.arange(lo, added, dtype=np.int64)
    slots = positions % ring.capacity
    ep = ring.ep_step[slots].astype(np.int64)
    if positions.size and (ep.min() < 0 or np.any(ep[1:] > ep[:-1] + 1)):
        raise CorruptStoreError(
            f"{root}: the ep_step array is inconsistent with the committed state (steps {lo}..{added - 1}); "
            "the store is damaged: run `replaystore verify`"
        )


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
