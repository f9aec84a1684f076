"""The ring of steps in RAM: per-slot scalars and which slots are sampleable transitions.

The store keeps *steps*, not transitions (docs/format.md, "The data model"). Step ``t`` (a position, counted
from the store's birth) lives in slot ``t % capacity`` and holds the observation seen at ``t``; if the
episode went on, also the action taken, the reward and the ``terminated``/``truncated`` flags of that
move. The last step of an episode (``is_last``) holds only its observation. ``ep_step`` is the step's
index within its episode, which is all frame stacking needs: offset ``m`` of the stack ending at
``t`` is step ``t - min(m, ep_step[t])`` (the episode's first frame repeats as padding).

Step ``t`` is a sampleable (1-step) transition when it is live, not last, its successor ``t+1`` is
stored, and its stack does not reach below the oldest live step. That set is kept as a per-slot
bitmap ``valid`` with a count, updated at O(frame_stack) cost per step, so ``len()`` is O(1) and
uniform sampling is one vectorised draw plus a gather. The scalars are small (19 bytes a step with a
Discrete action, plus 1 for the bitmap; a Box action and the store's extras add their own bytes), so
the whole ring of them lives in RAM (20 MB per million steps) and is written to disk as shards.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.spaces import StepField

SMALL_RANGE = 16


def new_fields(specs: dict[str, StepField], length: int) -> dict[str, np.ndarray]:
    """Zeroed per-step arrays of ``length`` slots for ``specs`` (schema.scalar_fields)."""
    return {name: np.zeros((length, *shape), dtype=dtype) for name, (shape, dtype) in specs.items()}


def name_fields(obj: Any) -> None:
    """``obj.action``, ``obj.reward``, ... for ``obj.fields[...]``: the names the hot paths use."""
    fields = obj.fields
    obj.action, obj.reward, obj.terminated = fields["action"], fields["reward"], fields["terminated"]
    obj.truncated, obj.is_last, obj.ep_step = fields["truncated"], fields["is_last"], fields["ep_step"]
    obj.priority = fields["priority"]


class Ring:
    """Per-slot scalars of ``capacity`` steps, the live range and the sampleable bitmap."""

    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    is_last: np.ndarray
    ep_step: np.ndarray
    priority: np.ndarray
    #: the dtype sampled actions are returned in (schema.batch_action; rings.py sets a Box store's)
    action_dtype = np.dtype(np.int64)

    def __init__(self, capacity: int, frame_stack: int, shard_len: int, fields: dict[str, StepField | np.ndarray], *,
                 valid: np.ndarray | None = None) -> None:
        """``fields``: every per-step field, as its spec (schema.scalar_fields: new arrays are made) or
        as an array of ``capacity`` slots to use (a stream's views of a store's arrays, see rings.py);
        ``valid`` likewise."""
        self.capacity = capacity
        self.frame_stack = frame_stack
        self.shard_len = shard_len
        self.fields: dict[str, np.ndarray] = {
            name: f if isinstance(f, np.ndarray) else np.zeros((capacity, *f[0]), dtype=f[1]) for name, f in fields.items()
        }
        name_fields(self)
        #: the extras' arrays (format/extras.py), by field name: zeroed with each new step, set with its move
        self.extras = {name: values for name, values in self.fields.items() if name.startswith(EXTRAS)}
        self.valid = valid if valid is not None else np.zeros(capacity, dtype=bool)
        self.n_valid = 0
        self.added = 0
        self.oldest = 0
        self.dirty_shards: set[int] = set()  # shards whose scalars changed: every field is rewritten
        self.dirty_priority_shards: set[int] = set()  # shards where only priorities changed

    # ---------------------------------------------------------------------------------------------
    # Live range

    @property
    def lo(self) -> int:
        """The oldest live position."""
        return max(self.oldest, self.added - self.capacity)

    @property
    def live_steps(self) -> int:
        return self.added - self.lo

    def slot(self, position: int) -> int:
        return position % self.capacity

    def slots(self, positions: np.ndarray) -> np.ndarray:
        """The slots of ``positions`` (the interface rings.py's ``Rings`` shares)."""
        return positions % self.capacity

    def heads(self, positions: np.ndarray) -> int:
        """For each of ``positions``, the first position not yet stored in its stream (here: ``added``)."""
        return self.added

    # ---------------------------------------------------------------------------------------------
    # Writing

    def append_step(self, ep_step: int, is_last: bool) -> int:
        """Start step ``added`` (its observation is written by the caller); returns its position."""
        position = self.added
        if position + 1 - self.capacity > self.oldest:  # full: the oldest step goes
            self._retire_below(position + 1 - self.capacity)
        s = position % self.capacity
        self.action[s] = 0
        self.reward[s] = 0.0
        self.terminated[s] = False
        self.truncated[s] = False
        self.is_last[s] = is_last
        self.priority[s] = 0.0
        self.ep_step[s] = ep_step
        for values in self.extras.values():
            values[s] = 0
        self.valid[s] = False
        self.added = position + 1
        self.dirty_shards.add(s // self.shard_len)
        return position

    def set_move(self, position: int, action: int | np.ndarray, reward: float, terminated: bool, truncated: bool,
                 extras: dict[str, np.ndarray] | None = None) -> None:
        """Record the move made from step ``position`` (the head of the episode in progress), with its
        ``extras`` (field -> value, every extra of the store: validate.check_extras)."""
        s = position % self.capacity
        self.action[s] = action
        self.reward[s] = reward
        self.terminated[s] = terminated
        self.truncated[s] = truncated
        if extras:
            for name, value in extras.items():
                self.extras[name][s] = value
        self.dirty_shards.add(s // self.shard_len)

    def mark_transition(self, position: int) -> None:
        """Step ``position`` now has its successor stored: make it sampleable if its stack is live."""
        s = position % self.capacity
        lo = self.lo
        if self.is_last[s] or position + 1 >= self.added or position < lo or self.valid[s]:
            return
        if position - min(self.frame_stack - 1, int(self.ep_step[s])) >= lo:
            self.valid[s] = True
            self.n_valid += 1

    def set_oldest(self, oldest: int) -> None:
        """Retire every step before ``oldest`` (used by commits that shrink the live range)."""
        self._retire_below(oldest)
        self.oldest = max(self.oldest, oldest)

    def _retire_below(self, new_lo: int) -> None:
        old_lo = self.lo
        if new_lo <= old_lo:
            return
        k1 = self.frame_stack - 1
        if new_lo - old_lo <= SMALL_RANGE:
            for p in range(old_lo, new_lo):
                s = p % self.capacity
                if self.valid[s]:
                    self.valid[s] = False
                    self.n_valid -= 1
            for p in range(new_lo, min(new_lo + k1, self.added)):
                s = p % self.capacity
                if self.valid[s] and p - min(k1, int(self.ep_step[s])) < new_lo:
                    self.valid[s] = False
                    self.n_valid -= 1
        else:
            dead = np.arange(old_lo, min(new_lo, self.added)) % self.capacity
            self.n_valid -= int(np.count_nonzero(self.valid[dead]))
            self.valid[dead] = False
            edge = np.arange(new_lo, min(new_lo + k1, self.added))
            es = edge % self.capacity
            bad = es[self.valid[es] & (edge - np.minimum(k1, self.ep_step[es]) < new_lo)]
            self.n_valid -= int(bad.size)
            self.valid[bad] = False

    # ---------------------------------------------------------------------------------------------
    # Reading

    def rebuild_valid(self) -> None:
        """Recompute the sampleable bitmap from the scalars (after loading them from disk)."""
        self.valid[:] = False
        self.n_valid = 0
        self.revalidate(self.lo)

    def revalidate(self, start: int) -> None:
        """Recompute the bitmap for positions from ``start`` on (after newer steps were loaded from
        disk there: ``refresh``); positions below ``start`` keep theirs."""
        start = max(start, self.lo)
        positions = np.arange(start, max(start, self.added), dtype=np.int64)
        slots = positions % self.capacity
        self.n_valid -= int(np.count_nonzero(self.valid[slots]))
        ok = ~self.is_last[slots] & (positions - np.minimum(self.frame_stack - 1, self.ep_step[slots]) >= self.lo)
        ok[-1:] = False  # the head has no successor yet
        self.valid[slots] = ok
        self.n_valid += int(np.count_nonzero(ok))

    def stack_positions(self, positions: np.ndarray) -> np.ndarray:
        """``(len, frame_stack)`` positions of the frames stacked at each step, oldest first."""
        offsets = np.arange(self.frame_stack - 1, -1, -1, dtype=np.int64)
        ep = self.ep_step[positions % self.capacity].astype(np.int64)
        return positions[:, None] - np.minimum(offsets[None, :], ep[:, None])

    def episode_ends(self) -> np.ndarray:
        """Positions of the live ``is_last`` steps, oldest first."""
        positions = np.arange(self.lo, self.added, dtype=np.int64)
        return positions[self.is_last[positions % self.capacity]]
