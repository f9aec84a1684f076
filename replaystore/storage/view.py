"""What a store reads of its streams: each stream's commit loaded into its ring (its scalars, and its
frame shards as of that commit), consistently while writers in other processes go on.

Loading (``load``) reads every stream's scalars, then keeps the frame shards of the view readable
as they are (``FrameShards.keep``: a local store's files stay open), then reads the commits of the
streams it does not write once more (``settle``). A writer always commits a higher live start
*before* it overwrites any step, so every step at or above the live start committed *after* the
loads was intact in what was read: the steps below it leave the view, and the view is consistent
with no retry, unless a writer lapped everything that was loaded (then the store loads again).

Following live writers (``refresh``) reads, for each stream this store does not write whose commit
moved, only what the writer can have rewritten: the scalar shards from two steps behind the old
head (``end_episode`` changes those) to the new head, and those shards' frames. Steps retired
meanwhile leave the view first, and the commit is read once more as ``load`` does.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from replaystore.errors import CorruptStoreError
from replaystore.format.schema import Layout, State
from replaystore.storage.backend import Backend
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings
from replaystore.storage.scalars import load_scalars

ATTEMPTS = 100


class View:
    """The commits of ``rings``' streams as this store reads them (``states[k]``, as loaded or refreshed)."""

    def __init__(self, backend: Backend, layout: Layout, rings: Rings, reader: FrameReader) -> None:
        self.backend = backend
        self.layout = layout
        self.rings = rings
        self.reader = reader
        self.states: list[State] = [State()] * rings.num_streams

    def load(self, writing: list[int]) -> None:
        """Load every stream at its latest commit (a stream in ``writing`` is claimed by this process:
        its own). Raises ``CorruptStoreError`` for a damaged store, ``StoreLockedError`` when writers
        lap every attempt."""
        backend = self.backend
        for _ in range(ATTEMPTS):
            states = [backend.read_state(k) for k in range(self.rings.num_streams)]
            try:
                for k, state in enumerate(states):
                    self._load(k, state)
            except CorruptStoreError:
                if not self._moved(states, writing):
                    raise  # nothing moved: the store really is damaged
                self.reader.close()  # torn by a writer overwriting what was read: load again at the new commits
                continue
            if len(writing) < self.rings.num_streams:
                self.reader.keep()  # the frames of these commits stay readable while other writers move on
            if self._settle(states, writing):
                return
            self.reader.close()
        from replaystore.errors import StoreLockedError

        raise StoreLockedError(f"{backend.where} is being rewritten faster than it can be read; open it again")

    def _load(self, k: int, state: State) -> None:
        ring = self.rings.streams[k]
        ring.added, ring.oldest = state.added, state.oldest
        load_scalars(self.backend, k, ring, self.layout)
        for shard in self.backend.follow(k):
            self.reader.invalidate(shard)
        ring.rebuild_valid()
        self.states[k] = state

    def _moved(self, states: list[State], writing: list[int]) -> bool:
        """Whether a stream not in ``writing`` has a higher live start than in ``states``."""
        cap = self.rings.stream_capacity
        return any(k not in writing and self.backend.read_state(k).live_start(cap) != state.live_start(cap)
                   for k, state in enumerate(states))

    def _settle(self, states: list[State], writing: list[int]) -> bool:
        """Hide what writers of the streams not in ``writing`` overwrote while they were loaded;
        False when a writer lapped everything loaded (load again)."""
        cap = self.rings.stream_capacity
        for k, state in enumerate(states):
            if k in writing:
                continue
            safe_lo = self.backend.read_state(k).live_start(cap)
            if safe_lo <= state.live_start(cap):
                continue
            if safe_lo >= state.added:
                return False
            self.rings.streams[k].set_oldest(safe_lo)
            self.states[k] = dataclasses.replace(self.states[k], oldest=safe_lo)
        return True

    # ---------------------------------------------------------------------------------------------

    def refresh(self, k: int) -> int | None:
        """Bring stream ``k`` (one this store does not write) to its latest commit; returns the first
        position whose scalars were read again, or None if the commit had not moved."""
        ring = self.rings.streams[k]
        cap = ring.capacity
        old = self.states[k]
        new = self.backend.read_state(k)
        if (new.added == old.added and new.episode_in_progress == old.episode_in_progress
                and new.live_start(cap) <= ring.lo):
            return None  # (end_episode commits the same steps with the episode closed: that is a move too)
        if new.added < old.added:
            raise CorruptStoreError(f"stream {k} of {self.backend.where} went back from {old.added} to {new.added} "
                                    "steps: the store was replaced; open it again")
        for _ in range(ATTEMPTS):
            first = max(old.added - 2, 0, new.live_start(cap))
            shard_len = ring.shard_len
            if new.added - first >= cap:
                shards = list(range(-(-cap // shard_len)))
            else:
                shards = np.unique((np.arange(first, new.added, dtype=np.int64) % cap) // shard_len).tolist()
            changed = set(self.backend.follow(k))
            changed.update(self.backend.shard_of(k, j) for j in shards)
            for shard in sorted(changed):
                self.reader.invalidate(shard)
            ring.set_oldest(new.live_start(cap))
            load_scalars(self.backend, k, ring, self.layout, shards=shards, steps=(first, new.added), check=False)
            ring.added = new.added
            ring.oldest = max(ring.oldest, new.oldest)
            ring.revalidate(first)
            self.reader.keep()  # the rewritten shards' frames, as of this commit, stay readable
            again = self.backend.read_state(k)
            if again.live_start(cap) >= new.added and new.added > 0 and again.added > new.added:
                old, new = State(added=new.added, oldest=new.added), again  # lapped while loading: load again
                continue
            if again.live_start(cap) > ring.lo:
                ring.set_oldest(again.live_start(cap))
            self.states[k] = dataclasses.replace(new, oldest=ring.oldest)
            return first
        raise CorruptStoreError(f"stream {k} of {self.backend.where} is being rewritten faster than it can be read; "
                                "refresh again")
