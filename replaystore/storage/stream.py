"""One episode stream of a store: its ring (a view of the store's arrays, rings.py), its last
commit as this process knows it, and, when this process writes it, its writer, the observation the
next ``add`` must continue from, and the vector-env autoreset bookkeeping (storage/writing.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replaystore.format.schema import State
from replaystore.storage.ring import Ring
from replaystore.storage.writer import Writer


@dataclass(eq=False)
class Stream:
    index: int
    ring: Ring
    committed: State  # as loaded (or refreshed); a writer's own commits are ``writer.committed``
    base_shard: int  # the stream's shard 0 is the arrays' shard ``base_shard``
    writer: Writer | None = None
    head_obs: np.ndarray | None = None  # the next_obs the episode in progress continues from (None: no episode in progress)
    reset_next: np.ndarray | None = None  # next-step autoreset: the last obs of the episode just ended; the next row is the reset
    reset_optional: bool = False  # reset_next as found on open: the next row may be the reset, or a fresh env's first

    def episode_in_progress(self) -> bool:
        ring = self.ring
        return ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])
