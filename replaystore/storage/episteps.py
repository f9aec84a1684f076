"""A stream's ``ep_step`` kept as the positions where its episodes start, not as a number per step.

Within an episode ``ep_step`` counts up by one from 0 (format.md, "The data model"), so it is
``p - start(p)``, where ``start(p)`` is the newest episode start at or before ``p``. The index
holds those starts, sorted (8 bytes an episode instead of 4 a step: 250 MB less per 62M steps),
and answers a batch of slots with one ``searchsorted``. A stream whose oldest live step is
mid-episode (the ring wrapped, or the store was imported from a fragment) has a *virtual* start
before it: ``lo - ep_step(lo)``.

Steps come in in order: ``append`` for one step (the writer), ``Loading`` for a run read from the
shards (scalars.py), which also checks the run counts up as it must. Retiring old steps drops the
starts no live step needs (``trim``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaystore.storage.columns import whole_array, whole_copy


class EpisodeSteps:
    """``ep_step`` of one stream's live steps, by slot (``positions_of`` maps slots to positions)."""

    dtype = np.dtype(np.int32)

    def __init__(self, capacity: int, positions_of: Callable[[np.ndarray], np.ndarray],
                 live: Callable[[], tuple[int, int]]) -> None:
        """``positions_of``: the ring's slots to positions; ``live``: its live positions ``[lo, added)``."""
        self.capacity = capacity
        self.positions_of = positions_of
        self.live = live
        self._starts = np.zeros(16, dtype=np.int64)
        self._head = 0  # starts before this are dropped
        self._n = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.capacity,)

    @property
    def nbytes(self) -> int:
        return int(self._starts.nbytes)

    __array__ = whole_array
    copy = whole_copy

    def __len__(self) -> int:
        return self.capacity

    @property
    def starts(self) -> np.ndarray:
        """The starts kept, oldest first (the first may be virtual: before the oldest live step)."""
        return self._starts[self._head : self._n]

    def __getitem__(self, slots: Any) -> Any:
        """``ep_step`` by slot, 0 for a slot no live step holds (as a never-written slot reads)."""
        if isinstance(slots, slice):
            slots = np.arange(*slots.indices(self.capacity), dtype=np.int64)
        scalar = np.ndim(slots) == 0
        positions = self.positions_of(np.asarray(slots, dtype=np.int64))
        lo, added = self.live()
        out = np.where((positions >= lo) & (positions < added), self.at(positions), 0).astype(self.dtype)
        return out.reshape(()).item() if scalar else out

    def __setitem__(self, index: Any, values: Any) -> None:
        raise TypeError("ep_step is kept as episode starts: set it with append or a Loading")

    def at(self, positions: np.ndarray) -> np.ndarray:
        """``ep_step`` of live ``positions`` (any shape), as int64 (what position arithmetic takes)."""
        starts = self.starts
        if not starts.size:
            return np.zeros(np.shape(positions), dtype=np.int64)
        i = np.maximum(np.searchsorted(starts, positions, side="right") - 1, 0)
        return positions - starts[i]

    def of(self, position: int) -> int:
        """``ep_step`` of one live position."""
        if self._n > self._head:
            last = int(self._starts[self._n - 1])
            if position >= last:  # (the writer's case: a step of the newest episode)
                return position - last
            if self._n - self._head >= 2:
                first, second = int(self._starts[self._head]), int(self._starts[self._head + 1])
                if first <= position < second:  # (retiring: a step of the oldest episode)
                    return position - first
        starts = self.starts
        if not starts.size:
            return 0
        i = int(np.searchsorted(starts, position, side="right")) - 1
        return int(position - starts[max(i, 0)])

    def last_start(self) -> int | None:
        return int(self._starts[self._n - 1]) if self._n > self._head else None

    def _push(self, position: int) -> None:
        if self._n == len(self._starts):
            kept = self.starts.copy()
            self._starts = np.zeros(max(16, 2 * kept.size), dtype=np.int64)
            self._starts[: kept.size] = kept
            self._head, self._n = 0, kept.size
        self._starts[self._n] = position
        self._n += 1

    def append(self, position: int, ep_step: int) -> bool:
        """Step ``position`` (the newest) has ``ep_step``; False where that does not follow the step
        before (it is then taken as an episode start of its own)."""
        last = self.last_start()
        start = position - ep_step
        if last is not None and start == last:
            return True
        if ep_step < 0 or (last is not None and start < last):
            self._push(position)
            return False
        self._push(start)
        return True

    def truncate(self, position: int) -> None:
        """Forget the starts at or after ``position`` (the steps from there are loaded again)."""
        self._n = self._head + int(np.searchsorted(self.starts, position, side="left"))

    def trim(self, lo: int) -> None:
        """Drop the starts no step at or after ``lo`` needs (all but the newest at or before ``lo``)."""
        if self._n - self._head < 2 or self._starts[self._head + 1] > lo:
            return  # (the writer's case, step after step: nothing to drop, found in O(1))
        keep = self._head + max(0, int(np.searchsorted(self.starts, lo, side="right")) - 1)
        self._head = min(keep, self._n)
        if self._head > 1024 and self._head > self._n // 2:
            kept = self.starts.copy()
            self._starts[: kept.size] = kept
            self._head, self._n = 0, kept.size

    def clear(self) -> None:
        self._head = self._n = 0

    def snapshot(self) -> np.ndarray:
        return self.starts.copy()

    def restore(self, starts: np.ndarray) -> None:
        self.clear()
        for s in starts.tolist():
            self._push(s)


class Loading:
    """Feeds the ``ep_step`` of positions ``first, first + 1, ...`` in order into ``steps``; counts
    the steps whose value does not follow the step before (``broken``: a damaged store)."""

    def __init__(self, steps: EpisodeSteps, first: int, *, fresh: bool) -> None:
        """``fresh``: ``first`` is the oldest live step (it may be mid-episode); else it continues
        the starts kept before it."""
        self.steps = steps
        if fresh:
            steps.clear()
        else:
            steps.truncate(first)
        self.next = first
        self.broken = 0
        self.first_broken: int | None = None

    def feed(self, values: np.ndarray) -> None:
        if not values.size:
            return
        ep = values.astype(np.int64)
        positions = np.arange(self.next, self.next + ep.size, dtype=np.int64)
        # a step continues the one before it (start unchanged) unless it is 0 (a new start)
        follows = np.empty(ep.size, dtype=bool)
        follows[1:] = ep[1:] == ep[:-1] + 1
        last = self.steps.last_start()
        follows[0] = last is not None and positions[0] - ep[0] == last and ep[0] > 0
        for i in np.flatnonzero(~follows).tolist():
            # a run may begin mid-episode (a virtual start); anywhere else a step is 0 or follows
            fresh = i == 0 and last is None
            if not self.steps.append(int(positions[i]), int(ep[i])) or (ep[i] != 0 and not fresh):
                self._broke(int(positions[i]))
        self.next += ep.size

    def _broke(self, position: int) -> None:
        self.broken += 1
        if self.first_broken is None:
            self.first_broken = position
