"""Episodes: where each live episode of a stream lies in its ring, and one episode read whole.

A stream's ring holds its episodes one after another. An episode of T moves takes T + 1 steps: each
move's step holds the observation it was made from, the action, reward and how the move ended; the
step after its last move (``is_last``) holds the final observation. An episode in progress ends at
the newest step, whose observation has no move yet. Where a step's ``ep_step`` is 0 an episode
starts; the oldest live episode may have lost its first steps to the ring.

``episode_table`` finds every live episode from the scalar arrays alone (``replaystore inspect``
and ``episodes`` list them without decoding a frame); ``plan_episode`` reads one episode's scalars
and plans its frames through the store's ``FrameReader``, into an array of its own (an episode can
be 100+ MB of frames: it never goes into the reader's recycled output blocks). ``plan_span`` does
the same from a table made earlier, so that reading every episode (``ReplayStore.iter_episodes``)
makes each stream's table once, not once per episode.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from replaystore.errors import SampleError
from replaystore.sampling.memory import check_episode
from replaystore.sampling.pending import Pending
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import BLOCK_STEPS, Ring
from replaystore.storage.rings import SHIFT, Rings


@dataclass(frozen=True)
class Episode:
    """One live episode of one stream, whole as far as the ring still holds it.

    ``obs`` holds every observation, ``(moves + 1, *obs_shape)``: the one each move was made from,
    then the one after the last move (single frames, not stacks). ``action``, ``reward``,
    ``terminated`` and ``truncated`` hold the moves. ``ended`` is ``"terminated"``, ``"truncated"``,
    ``"in progress"`` (the writer is still adding to it), or ``"ended"`` (none of its moves is live).
    ``first_step`` is the stream position of its oldest live observation; ``from_start`` says
    whether that is the episode's first (False: the ring overwrote its start). Read in part
    (``episode(..., moves=slice(a, b))``), it holds moves ``a..b-1`` of the live ones and
    observations ``a..b``: ``first_move`` is ``a`` and ``first_step`` the position of observation
    ``a``; ``ended`` and ``from_start`` still describe the whole episode. A Dict store's ``obs`` is a
    dict of such arrays, one per key. ``extras``: the store's extras of the moves, by name, ``(moves, ...)``."""

    obs: np.ndarray
    action: np.ndarray  # (moves,) int64; a Box store's (moves, *shape) in its dtype
    reward: np.ndarray  # (moves,) float32
    terminated: np.ndarray  # (moves,) bool
    truncated: np.ndarray  # (moves,) bool
    stream: int
    index: int  # among the stream's live episodes, oldest first
    first_step: int
    from_start: bool
    ended: str
    first_move: int = 0  # the first of its live moves held here (> 0: read in part)
    extras: dict[str, np.ndarray] = field(default_factory=dict, kw_only=True)

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @property
    def episode_return(self) -> float:
        """The sum of the rewards of its live moves."""
        return float(self.reward.sum(dtype=np.float64))


def episode_table(ring: Ring) -> dict[str, np.ndarray]:
    """Per live episode of one stream's ``ring``, oldest first: ``returns``, ``lengths`` (moves),
    ``whole`` (start and end both live), ``ended`` (its last step is live), ``start_step`` and
    ``end_step`` (stream positions of its oldest and newest live step). The episodes come from the
    ring's index of episode starts; the returns are summed over the steps a block at a time, so the
    table's RAM is per episode, not per step."""
    lo, added = ring.lo, ring.added
    starts = ring.ep_step.starts
    if added <= lo or starts.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return {"returns": np.zeros(0), "lengths": empty, "whole": empty.astype(bool), "ended": empty.astype(bool),
                "start_step": empty, "end_step": empty}
    first = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)  # the episode that holds ``lo``
    eps = starts[first:]
    eps = eps[eps < added]
    start_step = np.maximum(eps, lo)
    end_step = np.append(eps[1:] - 1, added - 1)
    ended = ring.is_last[end_step % ring.capacity]
    # every step of an episode but its last holds a move (an episode in progress: its newest has none yet)
    lengths = (end_step - start_step).astype(np.int64)
    returns = np.zeros(eps.size)
    for at in range(lo, added - 1, BLOCK_STEPS):
        positions = np.arange(at, min(at + BLOCK_STEPS, added - 1), dtype=np.int64)
        slots = positions % ring.capacity
        rewards = np.where(ring.is_last[slots], 0.0, ring.reward[slots])
        episode = np.searchsorted(eps, positions, side="right") - 1
        returns += np.bincount(episode, weights=rewards, minlength=eps.size)
    return {"returns": returns, "lengths": lengths, "whole": ended & (eps >= lo), "ended": ended,
            "start_step": start_step, "end_step": end_step}


def move_flag_counts(ring: Ring) -> tuple[int, int]:
    """How many of the live moves of ``ring`` are terminated, and how many truncated (a block of
    steps at a time)."""
    terminated = truncated = 0
    for at in range(ring.lo, ring.added - 1, BLOCK_STEPS):
        slots = np.arange(at, min(at + BLOCK_STEPS, ring.added - 1), dtype=np.int64) % ring.capacity
        moves = ~ring.is_last[slots]
        terminated += int(np.count_nonzero(ring.terminated[slots] & moves))
        truncated += int(np.count_nonzero(ring.truncated[slots] & moves))
    return terminated, truncated


def how_it_ended(ring: Ring, table: dict[str, np.ndarray], i: int) -> tuple[str, bool]:
    """Episode ``i`` of ``episode_table(ring)``: how it ended (``Episode.ended``) and whether its
    first step is live (``Episode.from_start``)."""
    if not table["ended"][i]:
        ended = "in progress"
    elif table["lengths"][i]:  # the flags are on its last move, the step before its last observation
        ended = "terminated" if ring.terminated[(int(table["end_step"][i]) - 1) % ring.capacity] else "truncated"
    else:
        ended = "ended"
    return ended, bool(ring.ep_step[int(table["start_step"][i]) % ring.capacity] == 0)


def stream_ring(rings: Rings, stream: int) -> Ring:
    """Stream ``stream``'s ring; ``SampleError`` for a stream the store does not have."""
    n = rings.num_streams
    if isinstance(stream, bool) or not isinstance(stream, numbers.Integral) or not 0 <= stream < n:
        raise SampleError(f"stream is {stream!r}; this store has {n} stream{'s' if n > 1 else ''} (0..{n - 1})")
    return rings.streams[int(stream)]


def plan_episode(rings: Rings, reader: FrameReader, index: int, stream: int = 0, *, moves: slice | None = None,
                 budget: int | None = None) -> Pending:
    """Episode ``index`` of ``stream`` (negative: from the newest), or its ``moves``, its scalars read
    and its frames planned (call under the store's lock; ``finish`` without it). Raises
    ``SampleError`` for a stream or an index the store does not have, and for frames that would
    take more than half of ``budget`` (or of the memory this process may use)."""
    ring = stream_ring(rings, stream)
    table = episode_table(ring)
    count = int(table["start_step"].size)
    if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not -count <= index < count:
        held = f"-{count}..{count - 1}" if count else "none: add steps first"
        raise SampleError(f"episode index is {index!r}; stream {stream} holds {count} live episodes (index {held}; "
                          "negative counts from the newest)")
    i = int(index) % count
    return plan_span(ring, reader, stream, i, table, moves=moves, budget=budget)


def window(moves: slice | None, count: int, what: str) -> tuple[int, int]:
    """The moves ``a..b-1`` that ``moves`` (a slice of step 1, Python's rules) picks of ``count``."""
    if moves is None:
        return 0, count
    if not isinstance(moves, slice) or moves.step not in (None, 1):
        raise SampleError(f"moves is {moves!r}; give a slice of {what}'s moves, such as slice(0, 1000) (step 1)")
    try:
        a, b, _ = moves.indices(count)
    except TypeError:
        raise SampleError(f"moves is {moves!r}; its ends must be integers or None") from None
    return a, max(a, b)


def plan_span(ring: Ring, reader: FrameReader, stream: int, i: int, table: dict[str, np.ndarray], *,
              moves: slice | None = None, budget: int | None = None) -> Pending:
    """Episode ``i`` of ``table`` (``episode_table`` of ``stream``'s ring, now or earlier: its steps
    must still be live), or its ``moves``, its scalars read and its frames planned. ``SampleError``
    when the ring has overwritten its oldest step since ``table`` was made, or when the frames would
    take more than half of ``budget`` (or of the memory this process may use)."""
    first, last = int(table["start_step"][i]), int(table["end_step"][i])
    if first < ring.lo or last >= ring.added:
        raise SampleError(f"stream {stream}'s episode {i} (steps {first}..{last}) is no longer live: the writer "
                          f"overwrote it (live steps are {ring.lo}..{ring.added - 1}); read episodes from a handle "
                          "no one writes to, or faster than the ring turns over")
    what = f"stream {stream}'s episode {i}"
    a, b = window(moves, int(table["lengths"][i]), what)
    nbytes = (b - a + 1) * int(np.prod(reader.shape, dtype=np.int64)) * np.dtype(reader.dtype).itemsize
    check_episode(nbytes, budget, what=what + (f" ({b - a:,} moves)" if moves is not None else
                                              f" ({b - a:,} moves, all of it)"))
    positions = np.arange(first + a, first + b + 1, dtype=np.int64)
    slots = positions % ring.capacity
    move = slots[:-1]
    ended, from_start = how_it_ended(ring, table, i)
    fields: dict[str, np.ndarray] = {"action": ring.action[move].astype(ring.action_dtype, copy=False), "reward": ring.reward[move].astype(np.float32),
              "terminated": ring.terminated[move].copy(), "truncated": ring.truncated[move].copy(),
              **{name: values[move] for name, values in ring.extras.items()}}
    out = np.empty((positions.size, *reader.shape), dtype=reader.dtype)
    plans = reader.plan_many((int(stream) << SHIFT | positions)[None, None], [[out]])
    result = partial(Episode, stream=int(stream), index=i, first_step=first + a, from_start=from_start, ended=ended,
                     first_move=a)
    return Pending(fields, plans, ("obs",), [out], result)
