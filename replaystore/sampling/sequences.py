"""Sequences: windows of ``length`` consecutive transitions inside one episode of one stream, for
recurrent agents and world models (R2D2, DreamerV3), drawn uniformly over every valid window start.

A window starting at step ``s`` is valid when each of its moves ``s .. s + length - 1`` is a
sampleable transition (the ring's bitmap: not an episode's last step, its successor stored, its
stack live): then they all lie in one episode, and the window's last observation ``s + length`` is
stored. Episodes shorter than ``length`` moves hold no window and are never drawn.

Drawing costs what the window costs, not what the store holds: candidate starts are drawn uniformly
over the sampleable transitions (the uniform sampler's vectorised draw), each checked with
``length`` bitmap lookups, and the invalid ones drawn again; every accepted start is uniform over
the valid ones. Only when a few rounds find too few (episodes mostly shorter than the window) are the
valid starts enumerated, once per call. The frames come through the store's ``FrameReader`` like a
transition batch's: each chunk read once, from the compressed-chunk cache.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from replaystore.errors import SampleError
from replaystore.format.schema import Schema, batch_action
from replaystore.sampling.draws import count_sampleable, sample_uniform
from replaystore.sampling.pending import FieldSpec, Pending
from replaystore.sampling.samplers import Sampler, extras_spec
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings

MAX_ROUNDS = 4
MAX_LENGTH = 100_000


@dataclass(frozen=True)
class SequenceBatch:
    """A batch of windows of ``length`` consecutive transitions, the batch on the first axis.

    ``obs[i, t]`` is the frame stack at the window's step ``t`` (``t = length``: the observation
    after its last move), built as ``sample`` builds stacks; ``action``, ``reward``,
    ``terminated`` and ``truncated`` are the window's ``length`` moves; ``index`` holds the slot of
    each window's first step. A Dict store's ``obs`` is a dict of such arrays, one per key.
    ``extras``: the store's extras of the moves, by name, ``(batch, length, ...)`` each."""

    obs: np.ndarray  # (batch, length + 1, frame_stack, *obs_shape)
    action: np.ndarray  # (batch, length) int64; a Box store's (batch, length, *shape) in its dtype
    reward: np.ndarray  # (batch, length) float32
    terminated: np.ndarray  # (batch, length) bool
    truncated: np.ndarray  # (batch, length) bool
    index: np.ndarray  # (batch,) int64
    extras: dict[str, np.ndarray] = field(default_factory=dict, kw_only=True)

    def __len__(self) -> int:
        return int(self.index.shape[0])


class SequenceSampler(Sampler):
    """Windows of ``length`` consecutive transitions (see the module docstring)."""

    frames = ("obs",)
    length: int

    def __init__(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 1 <= length <= MAX_LENGTH:
            raise SampleError(f"length is {length!r}; it must be an int between 1 and {MAX_LENGTH} (moves per window)")
        self.length = int(length)

    def spec(self, batch_size: int, schema: Schema) -> dict[str, FieldSpec]:
        n, L = batch_size, self.length
        act_shape, act_dtype = batch_action(schema.action)
        return {"obs": ((n, L + 1, schema.frame_stack, *schema.observation.shape), np.dtype(schema.observation.dtype)),
                "action": ((n, L, *act_shape), np.dtype(act_dtype)), "reward": ((n, L), np.dtype(np.float32)),
                "terminated": ((n, L), np.dtype(bool)), "truncated": ((n, L), np.dtype(bool)),
                "index": ((n,), np.dtype(np.int64)), **extras_spec(schema, (n, L))}

    def plan(self, rings: Rings, reader: FrameReader, batch_size: int, rng: np.random.Generator, *,
             batches: int = 1, out: list[np.ndarray] | None = None) -> Pending:
        starts = self.draw(rings, batches * batch_size, rng)
        L = self.length
        moves = starts[:, None] + np.arange(L, dtype=np.int64)[None, :]
        slots = rings.slots(moves)
        steps = starts[:, None] + np.arange(L + 1, dtype=np.int64)[None, :]
        stacks = rings.stack_positions(steps.reshape(-1)).reshape(batches, 1, batch_size, L + 1, -1)
        if batches > 1 and out is None:
            raise ValueError("plan(..., batches > 1) needs an out array for the frames")
        outs: list = [None] if out is None else [[out[0][i]] for i in range(batches)]
        fields = {"action": rings.action[slots].astype(rings.action_dtype, copy=False), "reward": rings.reward[slots].astype(np.float32),
                  "terminated": rings.terminated[slots].copy(), "truncated": rings.truncated[slots].copy(),
                  "index": slots[:, 0].copy(), **{name: values[slots] for name, values in rings.extras.items()}}
        return Pending(fields, reader.plan_many(stacks, outs), self.frames, out, SequenceBatch)

    def draw(self, rings: Rings, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` window starts (global positions), uniform over the valid ones."""
        if count_sampleable(rings, 1) == 0:
            raise SampleError(f"the store holds no transitions, so no window of {self.length}; add more first")
        picked: list[np.ndarray] = []
        need = count
        frac = 1.0
        for _ in range(MAX_ROUNDS):
            candidates = sample_uniform(rings, int(need / frac * 1.1) + 8, rng)
            ok = self.valid(rings, candidates)
            frac = max(float(ok.mean()), 1e-3)
            good = candidates[ok]
            picked.append(good[:need])
            need -= min(need, good.size)
            if need == 0:
                return np.concatenate(picked)
        everyone = self.starts(rings)
        if everyone.size == 0:
            raise SampleError(f"no episode in the store has {self.length} moves, so there is no window of "
                              f"{self.length} consecutive transitions to sample; sample shorter windows or add "
                              "longer episodes")
        picked.append(everyone[rng.integers(0, everyone.size, size=need)])
        return np.concatenate(picked)

    def valid(self, rings: Rings, starts: np.ndarray) -> np.ndarray:
        """Which of ``starts`` begin a valid window (``length`` bitmap lookups each)."""
        ahead = starts[:, None] + np.arange(self.length, dtype=np.int64)[None, :]
        return rings.valid[rings.slots(ahead)].all(axis=1) & (ahead[:, -1] + 1 < _heads(rings, starts))

    def starts(self, rings: Rings) -> np.ndarray:
        """Every valid window start, oldest first in each stream (the whole live range's bitmap:
        what the draw falls back on when windows are rare)."""
        lo, hi = rings.live_ranges()
        out = []
        for a, b in zip(lo.tolist(), hi.tolist()):
            positions = np.arange(a, b, dtype=np.int64)
            if positions.size < self.length:
                continue
            ok = rings.valid[rings.slots(positions)].astype(np.int64)
            runs = np.concatenate([[0], np.cumsum(ok)])
            whole = runs[self.length:] - runs[: -self.length] == self.length  # windows of all-valid moves
            out.append(positions[: whole.size][whole])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _heads(rings: Rings, positions: np.ndarray) -> np.ndarray:
    heads = rings.heads(positions)
    return heads if isinstance(heads, np.ndarray) else np.full(positions.shape, heads, dtype=np.int64)
