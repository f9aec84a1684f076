"""Proportional prioritized replay (Schaul et al. 2016): a vectorised sum tree over the whole ring.

Each slot has a priority ``p`` (the ``priority`` scalar array, saved in the store like every other
per-step field, so a reopened store samples with it). A transition is drawn with probability
``p**alpha / sum(p**alpha)`` over the sampleable transitions, and its importance weight is
``(N * P(i))**-beta`` normalised by the largest possible weight, i.e. ``(leaf_i / min_leaf)**-beta``.
New transitions enter with the largest priority seen so far (1.0 in a fresh store).

The tree lives in two flat arrays in heap layout (``sum`` and ``min``, 2*2**ceil(log2(capacity))
float64 each, 32 MB for a million slots) whose leaves are ``p**alpha`` for sampleable slots and 0
otherwise. It is built lazily on the first prioritized call, rebuilt when ``alpha`` changes, and
every operation is a loop over the tree's levels (20 for a million slots) of numpy calls over the
whole batch: a set of updates touches each level once; a batch of draws descends once.

Keeping leaves in step with the ring without a hook in its hot path: between two syncs, the
sampleable bitmap can only change near the two ends of the live range (steps retired at the tail,
plus the ``frame_stack - 1`` after them whose stacks now reach dead data; steps added at the head,
plus the one before them that gained its successor). ``sync`` recomputes exactly those leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import SampleError
from replaystore.storage.rings import Rings

#: Priorities are clipped below to this, so every transition keeps a non-zero chance to be replayed.
MIN_PRIORITY = 1e-6


#: The largest priority the store keeps (it stores them as float32).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_priorities(index: Any, priority: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``update_priorities``' arguments checked: int64 slots below ``size`` and float64 priorities >= 0."""
    idx = np.asarray(index)
    prio = np.asarray(priority)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise SampleError(f"index must be a 1-D integer array such as batch.index, got {idx.dtype} of shape {idx.shape}")
    if prio.shape != idx.shape or prio.dtype.kind not in "iuf":
        raise SampleError(f"priority must be a numeric array of shape {idx.shape} (one per index), got {prio.dtype} "
                          f"of shape {prio.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise SampleError(f"index holds slots outside 0..{size - 1}; pass batch.index from this store")
    if prio.size and not (np.all(np.isfinite(prio)) and prio.min() >= 0):
        raise SampleError("priorities must be finite and >= 0 (use |td_error| + a small epsilon)")
    if prio.size and prio.max() > FLOAT32_MAX:  # (stored as float32: a larger one would be inf there)
        raise SampleError(f"a priority is {float(prio.max()):.3g}, beyond float32's range ({FLOAT32_MAX:.3g}), in which "
                          "the store keeps priorities; scale or clip the TD errors")
    return idx.astype(np.int64), prio.astype(np.float64)


def check_slots(index: Any, size: int) -> np.ndarray:
    """``index`` checked to hold slots of the store (``0 .. size - 1``), such as ``batch.index``."""
    idx = np.asarray(index)
    if idx.dtype.kind not in "iu" or (idx.size and (idx.min() < 0 or idx.max() >= size)):
        raise SampleError(f"index must hold integer slots in 0..{size - 1}, such as batch.index from this store")
    return idx


class SumTree:
    """Sums and minima over ``capacity`` non-negative leaves; a leaf of 0 is never drawn."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 1 << max(0, int(capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.sum = np.zeros(2 * self.size, dtype=np.float64)
        self.min = np.full(2 * self.size, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.sum[1])

    @property
    def min_leaf(self) -> float:
        """The smallest non-zero leaf (inf when every leaf is 0)."""
        return float(self.min[1])

    def leaves(self, slots: np.ndarray) -> np.ndarray:
        return self.sum[np.asarray(slots, dtype=np.int64) + self.size]

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``slots`` to ``values`` and fix their ancestors, one numpy pass per level."""
        idx = np.asarray(slots, dtype=np.int64) + self.size
        if idx.size == 0:
            return
        values = np.asarray(values, dtype=np.float64)
        self.sum[idx] = values
        self.min[idx] = np.where(values > 0, values, np.inf)
        idx = np.unique(idx >> 1)
        while True:
            left = idx << 1
            self.sum[idx] = self.sum[left] + self.sum[left + 1]
            self.min[idx] = np.minimum(self.min[left], self.min[left + 1])
            if idx[0] <= 1:
                return
            idx = np.unique(idx >> 1)

    def rebuild(self, values: np.ndarray) -> None:
        """Set every leaf at once (``values`` has ``capacity`` entries)."""
        size = self.size
        self.sum[size:] = 0.0
        self.sum[size : size + self.capacity] = values
        self.min[size:] = np.inf
        leaves = self.sum[size:]
        self.min[size:][leaves > 0] = leaves[leaves > 0]
        start = size
        while start > 1:
            half = start >> 1
            self.sum[half:start] = self.sum[start : 2 * start : 2] + self.sum[start + 1 : 2 * start : 2]
            self.min[half:start] = np.minimum(self.min[start : 2 * start : 2], self.min[start + 1 : 2 * start : 2])
            start = half

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each value in ``[0, total)``, the slot whose cumulative range holds it."""
        u = np.array(mass, dtype=np.float64)
        idx = np.ones(u.size, dtype=np.int64)
        for _ in range(self.depth):
            left = idx << 1
            left_sum = self.sum[left]
            right = u >= left_sum
            u -= np.where(right, left_sum, 0.0)
            idx = left + right
        return idx - self.size


class Priorities:
    """The prioritized sampler's state: the sum tree, kept in step with the streams' priorities (the
    ``priority`` field every writer saves with the store) and sampleable bitmaps, and the largest
    priority seen, which new transitions are written with (``rings.new_priority``)."""

    def __init__(self, rings: Rings) -> None:
        self.rings = rings
        self.tree: SumTree | None = None
        self.alpha = 0.0
        goods = [self.adopt(k) for k in range(rings.num_streams)]
        self.max_priority = max((g for g in goods if g is not None), default=1.0)
        self._seen = [(r.lo, r.added) for r in rings.streams]

    @property
    def max_priority(self) -> float:
        """The largest priority seen (1.0 in a new store): what a new transition gets."""
        return self.rings.new_priority

    @max_priority.setter
    def max_priority(self, value: float) -> None:
        self.rings.new_priority = value

    def adopt(self, k: int, start: int | None = None) -> float | None:
        """Check stream ``k``'s priorities read from disk (from position ``start`` on; default: its
        whole live range): a value never set (an older store) or damaged becomes 1.0. Returns the
        largest, or None when there are none."""
        ring = self.rings.streams[k]
        live = np.arange(max(ring.lo, start if start is not None else ring.lo), ring.added, dtype=np.int64)
        live %= ring.capacity
        p = ring.priority[live]
        bad = live[~(np.isfinite(p) & (p >= MIN_PRIORITY))]
        ring.priority[bad] = 1.0
        good = ring.priority[live]
        return float(good.max()) if good.size else None

    # ---------------------------------------------------------------------------------------------
    # Updates

    def update(self, slots: np.ndarray, priority: np.ndarray) -> None:
        """Set the priorities of ``slots`` (already validated: finite and >= 0)."""
        priority = np.maximum(priority.astype(np.float64), MIN_PRIORITY)
        rings = self.rings
        rings.priority[slots] = priority
        rings.mark_priority_dirty(slots)
        self.max_priority = max(self.max_priority, float(priority.max()))
        if self.tree is not None:
            self.tree.set(slots, self._leaf_values(slots))

    def sync(self, alpha: float) -> SumTree:
        """The tree for ``alpha``, with every leaf that the streams changed since the last sync fixed."""
        rings = self.rings
        now = [(r.lo, r.added) for r in rings.streams]
        if self.tree is None or alpha != self.alpha:
            if self.tree is None:
                self.tree = SumTree(rings.size)
            self.alpha = alpha
            self.tree.rebuild(self._leaf_values(np.arange(rings.size, dtype=np.int64)))
        elif now != self._seen:
            k1 = rings.frame_stack - 1
            changed = []
            for k, (ring, (lo, added)) in enumerate(zip(rings.streams, self._seen)):
                if (lo, added) == (ring.lo, ring.added):
                    continue
                # refresh() may have reloaded the two steps behind the old head (end_episode changes them)
                tail = np.arange(lo, min(ring.lo + k1, ring.added), dtype=np.int64)
                head = np.arange(max(added - 2, lo, 0), ring.added, dtype=np.int64)
                if tail.size + head.size >= ring.capacity:
                    changed.append(k * rings.stride + np.arange(ring.capacity, dtype=np.int64))
                else:
                    changed.append(k * rings.stride + np.concatenate([tail, head]) % ring.capacity)
            if changed:
                slots = np.unique(np.concatenate(changed))
                self.tree.set(slots, self._leaf_values(slots))
        self._seen = now
        return self.tree

    def _leaf_values(self, slots: np.ndarray) -> np.ndarray:
        rings = self.rings
        p = rings.priority[slots].astype(np.float64)
        return np.where(rings.valid[slots], p**self.alpha, 0.0)

    # ---------------------------------------------------------------------------------------------
    # Drawing

    def weights(self, tree: SumTree, slots: np.ndarray, beta: float) -> np.ndarray:
        """Importance weights ``(N P(i))**-beta / max_j (N P(j))**-beta`` for drawn ``slots``."""
        return ((tree.leaves(slots) / tree.min_leaf) ** (-beta)).astype(np.float32)
