"""Following live writers: ``ReplayStore.refresh`` brings the streams this process does not write up
to their writers' latest commits.

For each such stream whose commit moved since this store loaded it, only what the writer can have
rewritten is read again: the scalar shards from the two steps behind the old head (``end_episode``
changes them) to the new head, and those shards' frame files, which are reopened (so their
descriptors keep the version of this commit while the writer moves on). Steps retired meanwhile
leave the view first. Then the stream's commit is read once more: if the writer has since retired
steps this refresh loaded (it wrapped the ring), they are left out of the view, exactly as ``open``
does. Nothing else of the store is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from replaystore.errors import CorruptStoreError
from replaystore.format.schema import State

if TYPE_CHECKING:
    from replaystore.store import ReplayStore


def settle_streams(store: ReplayStore, states: list[State]) -> bool:
    """After ``open`` loaded the streams at ``states``: hide what writers of the streams this store
    does not write overwrote meanwhile. A writer always commits a higher live start *before* it
    overwrites any step, so every step at or above the live start committed *after* our loads was
    intact in the files we read (scalars) and opened (frame shards, kept open): drop the steps below
    it from this view and the view is consistent, with no retry. False when a writer lapped
    everything we loaded (load again)."""
    cap = store.schema.stream_capacity
    for k, state in enumerate(states):
        if k in store.writing:
            continue
        safe_lo = store._read_state(k).live_start(cap)
        if safe_lo <= state.live_start(cap):
            continue
        if safe_lo >= state.added:
            return False
        stream = store.streams[k]
        stream.ring.set_oldest(safe_lo)
        stream.committed = dataclasses.replace(stream.committed, oldest=safe_lo)
    return True


def refresh_streams(store: ReplayStore) -> list[int]:
    """Refresh every stream ``store`` does not write; returns those that moved. Call under the store's lock."""
    read_state = store._read_state
    moved = []
    for stream in store.streams:
        if stream.writer is None and _refresh(store, stream.index, read_state):
            moved.append(stream.index)
    return moved


def _refresh(store: ReplayStore, k: int, read_state: Callable[[int], State]) -> bool:
    stream = store.streams[k]
    ring = stream.ring
    cap = ring.capacity
    old = stream.committed
    new = read_state(k)
    if (new.added == old.added and new.episode_in_progress == old.episode_in_progress
            and new.live_start(cap) <= ring.lo):
        return False  # (end_episode commits the same steps with the episode closed: that is a move too)
    if new.added < old.added:
        raise CorruptStoreError(f"stream {k} of {store.path} went back from {old.added} to {new.added} steps: the store "
                                "was replaced; open it again")
    for _ in range(100):
        first = max(old.added - 2, 0, new.live_start(cap))
        shard_len = ring.shard_len
        if new.added - first >= cap:
            shards = list(range(-(-cap // shard_len)))
        else:
            shards = np.unique((np.arange(first, new.added, dtype=np.int64) % cap) // shard_len).tolist()
        for j in shards:
            store.reader.invalidate(stream.base_shard + j)
        ring.set_oldest(new.live_start(cap))
        store._load_scalars(k, shards=shards, check=False)
        ring.added = new.added
        ring.oldest = max(ring.oldest, new.oldest)
        ring.revalidate(first)
        store.reader.snapshot()  # the rewritten shards' files, as of this commit, stay open
        again = read_state(k)
        if again.live_start(cap) >= new.added and new.added > 0 and again.added > new.added:
            old, new = State(added=new.added, oldest=new.added), again  # lapped while loading: load again
            continue
        if again.live_start(cap) > ring.lo:
            ring.set_oldest(again.live_start(cap))
        stream.committed = dataclasses.replace(new, oldest=ring.oldest)
        store._priorities.adopt(k, first)
        return True
    raise CorruptStoreError(f"stream {k} of {store.path} is being rewritten faster than it can be read; refresh again")
