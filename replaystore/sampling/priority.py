"""Proportional prioritized replay (Schaul et al. 2016): a vectorised sum tree over the whole ring.

Each slot has a priority ``p`` (the ``priority`` scalar array, saved in the store like every other
per-step field, so a reopened store samples with it). A transition is drawn with probability
``p**alpha / sum(p**alpha)`` over the sampleable transitions, and its importance weight is
``(N * P(i))**-beta`` normalised by the largest possible weight, i.e. ``(leaf_i / min_leaf)**-beta``.
New transitions enter with the largest priority seen so far (1.0 in a fresh store).

The tree is two flat arrays in heap layout (``sum`` and ``min``, float64) over *blocks* of
``BLOCK`` slots: 2 * 2**ceil(log2(capacity / BLOCK)) entries each, half a byte a slot (32 bytes a
slot for a tree over every slot, which would not fit a 250M-step store in RAM). A leaf, ``p**alpha``
for a sampleable slot and 0 otherwise, is not kept: it is computed from the priority column and
the sampleable bitmap where needed, and a block's sum and minimum are recomputed from its leaves
whenever one of them changes, so they never drift. The tree is built lazily on the first
prioritized call, rebuilt when ``alpha`` changes, and every operation is a loop over its levels of
numpy calls over the whole batch: a set of updates touches each level once; a batch of draws
descends once, then finds each draw's slot within its block from that block's cumulative sums.

Keeping leaves in step with the ring without a hook in its hot path: between two syncs, the
sampleable bitmap can only change near the two ends of the live range (steps retired at the tail,
plus the ``frame_stack - 1`` after them whose stacks now reach dead data; steps added at the head,
plus the one before them that gained its successor). ``sync`` recomputes exactly those leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaystore.errors import SampleError
from replaystore.storage.ring import BLOCK_STEPS
from replaystore.storage.rings import Rings

#: Slots per leaf block of the sum tree: its RAM is 32 bytes a block (0.5 a slot), and a draw
#: computes one block's leaves.
BLOCK = 64

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
    """Sums and minima of non-negative leaves over ``capacity`` slots, a tree over blocks of
    ``BLOCK`` slots; a leaf of 0 is never drawn. The leaves are not kept: ``leaf_values(slots)``
    computes them (from the priorities and the sampleable bitmap), and ``refresh(slots)`` is told
    which changed."""

    def __init__(self, capacity: int, leaf_values: Callable[[np.ndarray], np.ndarray]) -> None:
        self.capacity = capacity
        self.leaf_values = leaf_values
        self.blocks = -(-capacity // BLOCK)
        self.size = 1 << max(0, int(self.blocks - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.sum = np.zeros(2 * self.size, dtype=np.float64)
        self.min = np.full(2 * self.size, np.inf, dtype=np.float64)
        self._within = np.arange(BLOCK, dtype=np.int64)

    @property
    def total(self) -> float:
        return float(self.sum[1])

    @property
    def min_leaf(self) -> float:
        """The smallest non-zero leaf (inf when every leaf is 0)."""
        return float(self.min[1])

    def leaves(self, slots: np.ndarray) -> np.ndarray:
        return self.leaf_values(np.asarray(slots, dtype=np.int64))

    def _block_leaves(self, blocks: np.ndarray) -> np.ndarray:
        """``(len(blocks), BLOCK)`` leaves of ``blocks`` (0 past the last slot)."""
        slots = blocks[:, None] * BLOCK + self._within[None, :]
        inside = slots < self.capacity
        values = self.leaf_values(np.minimum(slots, self.capacity - 1))
        return np.where(inside, values, 0.0)

    def _set_blocks(self, blocks: np.ndarray, values: np.ndarray) -> None:
        idx = blocks + self.size
        self.sum[idx] = values.sum(axis=1)
        self.min[idx] = np.where(values > 0, values, np.inf).min(axis=1)

    def refresh(self, slots: np.ndarray) -> None:
        """Recompute the blocks holding ``slots`` from their leaves, and their ancestors."""
        blocks = np.unique(np.asarray(slots, dtype=np.int64) // BLOCK)
        if blocks.size == 0:
            return
        self._set_blocks(blocks, self._block_leaves(blocks))
        idx = np.unique((blocks + self.size) >> 1)
        while idx[0] >= 1:
            left = idx << 1
            self.sum[idx] = self.sum[left] + self.sum[left + 1]
            self.min[idx] = np.minimum(self.min[left], self.min[left + 1])
            if idx[0] == 1:
                return
            idx = np.unique(idx >> 1)

    def rebuild(self) -> None:
        """Recompute every block (a million slots at a time), then the levels above."""
        size = self.size
        self.sum[size:] = 0.0
        self.min[size:] = np.inf
        step = max(1, BLOCK_STEPS // BLOCK)
        for first in range(0, self.blocks, step):
            blocks = np.arange(first, min(first + step, self.blocks), dtype=np.int64)
            self._set_blocks(blocks, self._block_leaves(blocks))
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
        blocks = idx - self.size
        values = self._block_leaves(blocks)
        within = (np.cumsum(values, axis=1) <= u[:, None]).sum(axis=1)
        # rounding can carry a mass past its block's last leaf: it is that leaf's (the last non-zero)
        last = BLOCK - 1 - np.argmax(values[:, ::-1] > 0, axis=1)
        within = np.minimum(within, last)
        return blocks * BLOCK + within


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
        best: float | None = None
        first = max(ring.lo, start if start is not None else ring.lo)
        for at in range(first, ring.added, BLOCK_STEPS):  # (a block at a time: the temporaries stay small)
            live = np.arange(at, min(at + BLOCK_STEPS, ring.added), dtype=np.int64) % ring.capacity
            p = ring.priority[live]
            bad = live[~(np.isfinite(p) & (p >= MIN_PRIORITY))]
            if bad.size:
                ring.priority[bad] = 1.0
                p = ring.priority[live]
            best = max(best if best is not None else -np.inf, float(p.max()))
        return best

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
            self.tree.refresh(slots)

    def sync(self, alpha: float) -> SumTree:
        """The tree for ``alpha``, with every leaf that the streams changed since the last sync fixed."""
        rings = self.rings
        now = [(r.lo, r.added) for r in rings.streams]
        if self.tree is None or alpha != self.alpha:
            if self.tree is None:
                self.tree = SumTree(rings.size, self._leaf_values)
            self.alpha = alpha
            self.tree.rebuild()
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
                self.tree.refresh(np.concatenate(changed))
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
