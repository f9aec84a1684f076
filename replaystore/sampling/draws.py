"""Which steps a batch uses: uniform draws over the sampleable transitions.

The ring keeps a per-slot bitmap of sampleable 1-step transitions and its count. A uniform draw is
vectorised acceptance over the live range: draw positions uniformly, keep those whose slot is
sampleable (and, for n-step, whose n-th successor is stored), repeat for the few that were rejected.
Every accepted draw is uniform over the accepted set, so the result is exactly uniform; the fraction
rejected is small (episode ends, the head, stacks reaching past the oldest step). When it is not
(tiny stores), the sampleable positions are enumerated and drawn from directly.

Prioritized draws work the same way with the sum tree in place of the uniform draw: descend the
tree for a batch of uniform masses, keep the slots that pass the same acceptance test (n-step needs
the successor stored), redraw the rest. Rejection keeps the draws exactly proportional over the
accepted set.
"""

from __future__ import annotations

import numpy as np

from replaystore.sampling.priority import SumTree
from replaystore.storage.ring import Ring
from replaystore.storage.rings import Rings

MAX_ROUNDS = 4


def n_step_span(ring: Ring | Rings, positions: np.ndarray, n_step: int) -> tuple[np.ndarray, np.ndarray]:
    """For each position: steps ``m`` to its n-step successor (<= n_step, shorter if the episode ends)
    and whether that successor is stored (in its stream)."""
    heads = ring.heads(positions)
    if n_step == 1:
        return np.ones(positions.size, dtype=np.int64), positions + 1 < heads
    ahead = positions[:, None] + np.arange(1, n_step + 1, dtype=np.int64)[None, :]
    stored = ahead < (heads[:, None] if isinstance(heads, np.ndarray) else heads)
    ends = ring.is_last[ring.slots(ahead)] & stored
    ends[:, -1] = True  # stop at n_step at the latest
    m = np.argmax(ends, axis=1).astype(np.int64) + 1
    return m, positions + m < heads


def accept(ring: Ring | Rings, positions: np.ndarray, n_step: int) -> np.ndarray:
    """Mask of positions that are sampleable with ``n_step``."""
    ok = ring.valid[ring.slots(positions)]
    if n_step > 1 and ok.any():
        _, stored = n_step_span(ring, positions, n_step)
        ok &= stored
    return ok


def sample_uniform(rings: Rings, batch_size: int, rng: np.random.Generator, *, n_step: int = 1) -> np.ndarray:
    """``batch_size`` global positions drawn uniformly (with replacement) from the sampleable
    transitions of every stream: a position is drawn uniformly from the streams' live ranges laid
    end to end, then accepted or drawn again, so a transition's chance does not depend on its stream."""
    lo, hi = rings.live_ranges()
    lengths = hi - lo
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    picked: list[np.ndarray] = []
    need = batch_size
    frac = max(rings.n_valid, 1) / max(total, 1)
    for _ in range(MAX_ROUNDS):
        u = rng.integers(0, max(total, 1), size=int(need / frac * 1.1) + 8, dtype=np.int64)
        if rings.num_streams == 1:
            draw = lo[0] + u
        else:
            k = np.searchsorted(ends, u, side="right")
            draw = lo[k] + (u - (ends[k] - lengths[k]))
        good = draw[accept(rings, draw, n_step)]
        picked.append(good[:need])
        need -= min(need, good.size)
        if need == 0:
            return np.concatenate(picked)
    candidates = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist())])
    candidates = candidates[accept(rings, candidates, n_step)]
    picked.append(candidates[rng.integers(0, candidates.size, size=need)])
    return np.concatenate(picked)


def sample_prioritized(rings: Rings, tree: SumTree, batch_size: int, rng: np.random.Generator, *,
                       n_step: int = 1) -> np.ndarray:
    """``batch_size`` global positions drawn with probability proportional to their tree leaves."""
    picked: list[np.ndarray] = []
    need = batch_size
    for _ in range(MAX_ROUNDS):
        slots = tree.find(rng.random(need + 4) * tree.total)
        slots = slots[(slots < rings.size)]
        slots = slots[tree.leaves(slots) > 0]
        positions = rings.positions_of_slots(slots)
        good = positions[accept(rings, positions, n_step)]
        picked.append(good[:need])
        need -= min(need, good.size)
        if need == 0:
            return np.concatenate(picked)
    lo, hi = rings.live_ranges()
    candidates = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist())])
    candidates = candidates[accept(rings, candidates, n_step)]
    mass = tree.leaves(rings.slots(candidates))
    picked.append(candidates[rng.choice(candidates.size, size=need, p=mass / mass.sum())])
    return np.concatenate(picked)


def count_sampleable(rings: Rings, n_step: int) -> int:
    """How many transitions ``sample(..., n_step=n_step)`` can return, over every stream."""
    return sum(_count_stream(ring, n_step) for ring in rings.streams)


def _count_stream(ring: Ring, n_step: int) -> int:
    if n_step == 1:
        return ring.n_valid
    # Only the n-1 steps behind the head can fail the n-step check.
    tail = np.arange(max(ring.lo, ring.added - n_step), max(ring.lo, ring.added - 1), dtype=np.int64)
    return ring.n_valid - int(np.count_nonzero(ring.valid[tail % ring.capacity] & ~accept(ring, tail, n_step)))
