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
uniform sampling is one vectorised draw plus a gather. The whole ring of scalars lives in RAM and is
written to disk as shards; in RAM they are narrow (columns.py): 3 bytes a step with a ``Discrete``
action of at most 256 values, at most 256 distinct rewards and priorities never updated (the flags,
the bitmap and a field of at most two values share a byte; ``ep_step`` is an index of episode
starts, episteps.py). A Box action and the store's extras add their own bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.spaces import ActionSpec, StepField
from replaystore.storage.columns import BitColumn, CodeColumn, new_columns, region
from replaystore.storage.episteps import EpisodeSteps

SMALL_RANGE = 16
#: Steps handled at once where a whole ring is scanned (its temporaries, ~40 bytes a step: 10 MB).
BLOCK_STEPS = 1 << 18


def name_fields(obj: Any) -> None:
    """``obj.action``, ``obj.reward``, ... for ``obj.fields[...]``: the names the hot paths use."""
    fields = obj.fields
    obj.action, obj.reward, obj.terminated = fields["action"], fields["reward"], fields["terminated"]
    obj.truncated, obj.is_last, obj.ep_step = fields["truncated"], fields["is_last"], fields["ep_step"]
    obj.priority = fields["priority"]


class Ring:
    """Per-slot scalars of ``capacity`` steps, the live range and the sampleable bitmap."""

    # the narrow columns of columns.py (extras and a Box action: numpy arrays), indexed alike
    action: Any
    reward: CodeColumn
    terminated: BitColumn
    truncated: BitColumn
    is_last: BitColumn
    ep_step: EpisodeSteps
    priority: CodeColumn
    valid: BitColumn
    #: the dtype sampled actions are returned in (schema.batch_action; rings.py sets a Box store's)
    action_dtype = np.dtype(np.int64)

    def __init__(self, capacity: int, frame_stack: int, shard_len: int, fields: dict[str, StepField] | None = None,
                 *, columns: dict[str, Any] | None = None, action: ActionSpec | None = None) -> None:
        """Either ``fields``, every per-step field's spec (schema.scalar_fields: new columns are made,
        ``action`` narrows a ``Discrete`` one), or ``columns``: views of a store's columns for this
        stream, ``valid`` among them, ``ep_step`` not (see rings.py). Each ring keeps its own
        ``ep_step`` index."""
        self.capacity = capacity
        self.frame_stack = frame_stack
        self.shard_len = shard_len
        if columns is None:
            assert fields is not None
            columns = new_columns(fields, capacity, action=action)
        self.valid = columns["valid"]
        self.fields: dict[str, Any] = {name: c for name, c in columns.items() if name != "valid"}
        self.fields["ep_step"] = EpisodeSteps(capacity, self.positions_of_slots, lambda: (self.lo, self.added))
        name_fields(self)
        # the byte the four flags share (columns.py new_columns), with the reward's and priority's first codes
        self._flags: np.ndarray = self.is_last.byte
        self._last_mask = int(self.is_last.mask)
        #: the extras' arrays (format/extras.py), by field name: zeroed with each new step, set with its move
        self.extras = {name: values for name, values in self.fields.items() if name.startswith(EXTRAS)}
        self.n_valid = 0
        self.added = 0
        self.oldest = 0
        self.dirty_shards: set[int] = set()  # shards whose scalars changed: every field is rewritten
        self.dirty_priority_shards: set[int] = set()  # shards where only priorities changed

    def positions_of_slots(self, slots: np.ndarray) -> np.ndarray:
        """The live position each of ``slots`` holds (or would, for a slot not live)."""
        lo = self.lo
        return lo + (slots - lo) % self.capacity

    @staticmethod
    def views(columns: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
        """Slots ``start .. stop - 1`` of a store's ``columns`` (rings.py), for one stream's ring."""
        return {name: region(values, start, stop) for name, values in columns.items()}

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
        self._flags[s] = self._last_mask if is_last else 0  # every flag at once (the sampleable one too)
        self.reward.zero(s)
        self.priority.zero(s)
        self.ep_step.append(position, ep_step)
        for values in self.extras.values():
            values[s] = 0
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
        if position - min(self.frame_stack - 1, self.ep_step.of(position)) >= lo:
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
                if self.valid[s] and p - min(k1, self.ep_step.of(p)) < new_lo:
                    self.valid[s] = False
                    self.n_valid -= 1
        else:
            dead = np.arange(old_lo, min(new_lo, self.added)) % self.capacity
            self.n_valid -= int(np.count_nonzero(self.valid[dead]))
            self.valid[dead] = False
            edge = np.arange(new_lo, min(new_lo + k1, self.added))
            es = edge % self.capacity
            bad = es[self.valid[es] & (edge - np.minimum(k1, self.ep_step.at(edge)) < new_lo)]
            self.n_valid -= int(bad.size)
            self.valid[bad] = False
        self.ep_step.trim(new_lo)

    # ---------------------------------------------------------------------------------------------
    # Reading

    def rebuild_valid(self) -> None:
        """Recompute the sampleable bitmap from the scalars (after loading them from disk)."""
        self.valid[:] = False
        self.n_valid = 0
        self.revalidate(self.lo)

    def revalidate(self, start: int) -> None:
        """Recompute the bitmap for positions from ``start`` on (after newer steps were loaded from
        disk there: ``refresh``); positions below ``start`` keep theirs. Done a block of steps at a
        time, so that the temporaries stay small whatever the ring's length."""
        start = max(start, self.lo)
        for first in range(start, max(start, self.added), BLOCK_STEPS):
            positions = np.arange(first, min(first + BLOCK_STEPS, self.added), dtype=np.int64)
            slots = positions % self.capacity
            self.n_valid -= int(np.count_nonzero(self.valid[slots]))
            ep = self.ep_step.at(positions)
            ok = ~self.is_last[slots] & (positions - np.minimum(self.frame_stack - 1, ep) >= self.lo)
            if positions[-1] == self.added - 1:
                ok[-1] = False  # the head has no successor yet
            self.valid[slots] = ok
            self.n_valid += int(np.count_nonzero(ok))

    def stack_positions(self, positions: np.ndarray) -> np.ndarray:
        """``(len, frame_stack)`` positions of the frames stacked at each step, oldest first."""
        offsets = np.arange(self.frame_stack - 1, -1, -1, dtype=np.int64)
        ep = self.ep_step.at(positions)
        return positions[:, None] - np.minimum(offsets[None, :], ep[:, None])

    def episode_ends(self) -> np.ndarray:
        """Positions of the live ``is_last`` steps, oldest first."""
        positions = np.arange(self.lo, self.added, dtype=np.int64)
        return positions[self.is_last[positions % self.capacity]]
