"""Which steps ``compact`` keeps, and where they go: pure functions of the source streams' rings
(scalars only) and the damage ``verify`` found; compact.py reads and writes the stores.

Episodes are the unit: an episode with a damaged step is dropped whole, one cut short is closed as
truncated, merging lays whole source streams end to end, and splitting cuts the source streams into
runs of whole episodes (see compact.py's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replaystore.cli.verify import Problem
from replaystore.format.schema import Schema, State
from replaystore.storage.ring import Ring


@dataclass
class Piece:
    """One source stream's kept steps: its ring, its number and the positions kept, oldest first;
    for ``merge``, the store it comes from (``source``, an index) and its first slot in that store's
    frames (``offset``: the stream's number times the store's stride)."""

    stream: int
    ring: Ring
    keep: np.ndarray
    source: int = 0
    offset: int = 0

    def part(self, keep: np.ndarray) -> Piece:
        """The same stream's steps ``keep``."""
        return Piece(self.stream, self.ring, keep, self.source, self.offset)


def damaged_slots(problems: list[Problem], schema: Schema, stride: int, states: list[State]) -> np.ndarray:
    """The store's slots (all streams) that verify found damaged."""
    bad = np.zeros(schema.num_streams * stride, dtype=bool)
    capacity = schema.stream_capacity
    for p in problems:
        if p.slots is not None:
            bad[p.slots[0] : p.slots[1] + 1] = True
        elif p.live_steps is not None:  # an ep_step break: the step where the structure breaks
            bad[p.stream * stride + np.arange(p.live_steps[0], p.live_steps[1] + 1) % capacity] = True
    return bad


def choose(ring: Ring, bad_slots: np.ndarray) -> tuple[np.ndarray, int]:
    """Live positions to keep, oldest first, and how many live steps were dropped.

    Episodes are split where ``ep_step`` is 0. An episode with a damaged step is dropped whole; a kept
    episode left without its end (the next one was dropped, or damage faked a boundary) is closed as
    truncated in ``ring`` itself, and one left with a single step (no move) is dropped too.
    """
    positions = np.arange(ring.lo, ring.added, dtype=np.int64)
    if positions.size == 0:
        return positions, 0
    cap = ring.capacity
    slots = positions % cap
    starts = ring.ep_step[slots] == 0
    starts[0] = True
    episode = np.cumsum(starts) - 1
    dropped = np.zeros(int(episode[-1]) + 1, dtype=bool)
    dropped[episode[bad_slots[slots]]] = True
    ends = np.r_[starts[1:], True]  # the last step of each episode, in order
    end_pos, end_ep = positions[ends], episode[ends]
    unended = ~ring.is_last[end_pos % cap] & ~dropped[end_ep]
    unended[-1] = False  # the newest episode may still be in progress: a writer can continue it
    lone = unended & (np.bincount(episode)[end_ep] < 2)
    dropped[end_ep[lone]] = True
    close = end_pos[unended & ~lone]
    ring.is_last[close % cap] = True
    ring.truncated[(close - 1) % cap] = True
    keep = ~dropped[episode]
    return positions[keep], int(np.count_nonzero(~keep))


def assign(pieces: list[Piece], n_new: int) -> tuple[list[list[Piece]], int]:
    """Merge: each source stream into one of ``n_new`` new streams, the fullest first into the
    emptiest, laid end to end in source order. Every piece's episode in progress is closed as
    truncated, and a piece that does not start its new stream loses its oldest episode if that
    began before its stream's oldest live step (``unjoin``). Returns the pieces per new stream and
    the steps so left out."""
    for piece in pieces:
        close_newest(piece)
    order = sorted(pieces, key=lambda p: (-p.keep.size, p.stream))
    targets: list[list[Piece]] = [[] for _ in range(n_new)]
    sizes = [0] * n_new
    for piece in order:
        j = min(range(n_new), key=lambda t: (sizes[t], t))
        targets[j].append(piece)
        sizes[j] += int(piece.keep.size)
    for group in targets:
        group.sort(key=lambda p: p.stream)
    return targets, unjoin(targets)


def split(pieces: list[Piece], n_new: int, per_stream: int) -> tuple[list[list[Piece]], int, int]:
    """Split: the source streams' episodes, in source order, into ``n_new`` runs of whole episodes
    of about equal length, one per new stream of ``per_stream`` steps; a run may hold the end of one
    source stream and the start of the next. Every piece's episode in progress is closed as
    truncated; the oldest steps beyond ``n_new * per_stream`` are left out first (as a ring would);
    then the runs are cut at the episode boundaries nearest to equal shares, each new stream taking
    at least one episode while there are as many. A source stream's oldest episode that began
    before its oldest live step is left out unless it starts its new stream (``unjoin``). Returns the
    pieces per new stream, the steps left out by ``unjoin`` and those left out to fit."""
    runs: list[tuple[Piece, int, int]] = []  # one per episode: its piece and its span of piece.keep
    for piece in pieces:
        close_newest(piece)
        ring, keep = piece.ring, piece.keep
        if not keep.size:
            continue
        starts = np.flatnonzero(ring.ep_step[keep % ring.capacity] == 0)
        bounds = np.r_[0, starts[starts > 0], keep.size]
        runs.extend((piece, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
    ends = np.cumsum([b - a for _, a, b in runs], dtype=np.int64)
    excess = int(ends[-1]) - n_new * per_stream if runs else 0
    if excess > 0:  # the oldest steps do not fit: whole episodes first, then the start of one
        gone = int(np.searchsorted(ends, excess, side="right"))
        piece, a, b = runs[gone]
        runs = [(piece, a + excess - (int(ends[gone - 1]) if gone else 0), b), *runs[gone + 1 :]]
        ends = ends[gone:] - excess
    cum = np.r_[0, ends]
    total, n_runs = int(cum[-1]), len(runs)
    cuts = [0]
    for j in range(1, n_new):
        if n_runs < n_new:
            cuts.append(min(j, n_runs))
            continue
        share = j * total / n_new
        i = int(np.searchsorted(cum, share))
        if i == cum.size or (i > 0 and share - cum[i - 1] <= cum[i] - share):
            i -= 1
        cuts.append(min(max(i, cuts[-1] + 1), n_runs - (n_new - j)))
    cuts.append(n_runs)
    targets: list[list[Piece]] = []
    for first, stop in zip(cuts[:-1], cuts[1:]):
        spans: list[tuple[Piece, int, int]] = []  # consecutive episodes of one piece joined into one span
        for piece, a, b in runs[first:stop]:
            if spans and spans[-1][0] is piece:
                spans[-1] = (piece, spans[-1][1], b)
            else:
                spans.append((piece, a, b))
        targets.append([piece.part(piece.keep[a:b]) for piece, a, b in spans])
    return targets, unjoin(targets), max(excess, 0)


def unjoin(targets: list[list[Piece]]) -> int:
    """Leave out the oldest episode of every piece that does not start its new stream if that
    episode began before the piece's first step (its first frames are gone, so its steps cannot
    follow another episode's); returns the steps so left out."""
    unjoined = 0
    for group in targets:
        for piece in group[1:]:
            ring, keep = piece.ring, piece.keep
            if keep.size and ring.ep_step[keep[0] % ring.capacity] != 0:
                first_start = np.flatnonzero(ring.ep_step[keep % ring.capacity] == 0)
                n = int(first_start[0]) if first_start.size else int(keep.size)
                piece.keep = keep[n:]
                unjoined += n
    return unjoined


def close_newest(piece: Piece) -> None:
    """Close ``piece``'s newest episode as truncated if it is in progress (drop it if it has no move)."""
    ring, keep = piece.ring, piece.keep
    if not keep.size:
        return
    cap = ring.capacity
    last = int(keep[-1])
    if ring.is_last[last % cap]:
        return
    if ring.ep_step[last % cap] == 0 or keep.size < 2:  # one step, no move yet
        piece.keep = keep[:-1]
        return
    ring.is_last[last % cap] = True
    ring.truncated[(last - 1) % cap] = True


def cut_oldest(pieces: list[Piece], capacity: int) -> int:
    """Leave out the oldest steps of a new stream's pieces beyond ``capacity``; returns how many."""
    excess = sum(int(p.keep.size) for p in pieces) - capacity
    cut = max(0, excess)
    for piece in pieces:
        if excess <= 0:
            break
        n = min(excess, int(piece.keep.size))
        piece.keep = piece.keep[n:]
        excess -= n
    return cut
