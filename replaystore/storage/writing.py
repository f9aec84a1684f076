"""The writing half of ``ReplayStore``: ``add``, ``end_episode``, ``load_steps`` and ``flush``. A
mixin, like ``sampling.methods.Sampling``, so ``store.py`` keeps construction, the lifecycle and the
wiring; both halves share the store's ring, writer and lock.

``add`` validates everything before it changes anything, then writes through the ``Writer``
(storage/writer.py), which commits by itself whenever the ring moves onto another shard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.format.schema import Schema
from replaystore.format.validate import (
    check_action,
    check_flag,
    check_obs,
    check_reward,
)
from replaystore.sampling.priority import Priorities
from replaystore.storage.ring import Ring
from replaystore.storage.writer import Writer


class Writing:
    """Writing methods of ``ReplayStore`` (see store.py for the attributes they use)."""

    path: Path
    schema: Schema
    ring: Ring
    _mutex: threading.RLock
    _priorities: Priorities
    _head_obs: np.ndarray | None
    _episode_in_progress: Callable[[], bool]  # ReplayStore's
    _require_writer: Callable[[str], Writer]  # ReplayStore's: raises unless open for writing

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any) -> None:
        """Add one transition ``(obs, action, reward, next_obs, terminated, truncated)``.

        ``obs`` must equal the previous transition's ``next_obs`` unless that one ended the episode.
        Each observation is stored once. Nothing is changed if any argument is rejected.
        """
        with self._mutex:
            self._add(obs, action, reward, next_obs, terminated, truncated)

    def _add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any) -> None:
        writer = self._require_writer("add")
        obs_a = check_obs(self.schema, self.path, obs, "obs")
        next_a = check_obs(self.schema, self.path, next_obs, "next_obs")
        act = check_action(self.schema, self.path, action)
        rew = check_reward(reward)
        term = check_flag(terminated, "terminated")
        trunc = check_flag(truncated, "truncated")
        in_progress = self._episode_in_progress()
        if in_progress and not np.array_equal(obs_a, self._head_obs, equal_nan=obs_a.dtype.kind == "f"):
            raise InvalidTransitionError(
                f"obs does not continue the episode in progress in {self.path}: it differs from the previous "
                "transition's next_obs; pass that next_obs as obs, or end the episode (terminated or truncated) "
                "before starting a new one"
            )
        ring = self.ring
        frames = [ring.added, ring.added + 1] if not in_progress else [ring.added]
        # Writing reaches the disk only when a frame falls outside the writer's shard (once a shard):
        # then keep what this call changes, so that a failed write can put it all back.
        undo = self._undo_point(frames) if writer.writes_for(frames) else None
        try:
            if not in_progress:
                writer.put_frame(ring.added, obs_a)
                ring.append_step(0, False)
                writer.episodes += 1
            head = ring.added - 1
            ring.set_move(head, act, rew, term, trunc)
            ring.priority[head % ring.capacity] = self._priorities.max_priority
            writer.put_frame(ring.added, next_a)
            done = term or trunc
            ring.append_step(int(ring.ep_step[head % ring.capacity]) + 1, done)
            ring.mark_transition(head)
        except BaseException:
            if undo is not None:
                undo()
            raise
        self._head_obs = None if done else next_a.copy()

    def _undo_point(self, frames: list[int]) -> Callable[[], None]:
        """A function that puts back everything in RAM an ``add`` writing ``frames`` can change: the
        steps it adds, the move before them, the old steps it retires (and the stacks that reached
        them), the counters, and the writer's buffer. The disk needs no undoing: a commit that fails
        leaves the last committed state in place, and every step it calls live is still whole on
        disk (a shard rewritten before the failure holds the same live steps; storage/writer.py)."""
        ring, writer = self.ring, self._require_writer("add")
        lo = ring.lo
        positions = np.r_[frames[0] - 1 : frames[-1] + 1, lo : lo + len(frames) + ring.frame_stack].astype(np.int64)
        slots = np.unique(positions[positions >= 0] % ring.capacity)
        saved = {name: values[slots].copy() for name, values in ring.fields.items()}
        valid = ring.valid[slots].copy()
        counters = (ring.added, ring.oldest, ring.n_valid, set(ring.dirty_shards), set(ring.dirty_priority_shards))
        head_obs = self._head_obs
        restore_writer = writer.undo_point(frames)

        def undo() -> None:
            for name, values in ring.fields.items():
                values[slots] = saved[name]
            ring.valid[slots] = valid
            ring.added, ring.oldest, ring.n_valid = counters[:3]
            ring.dirty_shards, ring.dirty_priority_shards = set(counters[3]), set(counters[4])
            self._head_obs = head_obs
            restore_writer()

        return undo

    def load_steps(self, scalars: Mapping[str, np.ndarray], frame_blocks: Iterable[np.ndarray]) -> None:
        """Fill this new, empty store with whole steps at positions ``0 .. n-1`` (``compact`` copies a
        store's live steps this way): ``scalars`` holds every per-step field of ``SCALAR_FIELDS`` for
        the ``n`` steps, ``frame_blocks`` yields their observations in order, a block at a time.
        Episodes keep their ``ep_step``, so stacks and n-step returns are what they were; an episode
        left in progress at the end is continued by the next ``add``. The steps are not validated
        again: they come from a verified store. Call ``flush`` to commit them.
        """
        with self._mutex:
            writer = self._require_writer("load steps")
            ring = self.ring
            n = len(scalars["ep_step"])
            if ring.added or n > ring.capacity or any(len(scalars[name]) != n for name in ring.fields):
                raise ConfigError(f"load_steps fills an empty store with at most {ring.capacity} steps and every "
                                  f"per-step field of the same length; {self.path} holds {ring.added} steps and "
                                  f"{n} were given")
            for name, values in ring.fields.items():
                values[:n] = scalars[name]
            ring.added = n
            ring.dirty_shards.update(range(-(-max(n, 1) // ring.shard_len)))
            ring.rebuild_valid()
            self._priorities = Priorities(ring)
            starts = ring.ep_step[:n] == 0
            writer.episodes = int(np.count_nonzero(starts)) + (1 if n and not starts[0] else 0)
            position = 0
            for block in frame_blocks:
                for frame in block:
                    writer.put_frame(position, frame)
                    position += 1
            if position != n:
                raise ConfigError(f"load_steps was given {n} steps of scalars but {position} frames")
            if n and not ring.is_last[n - 1]:
                self._head_obs = writer.frame_at(n - 1)

    def end_episode(self) -> bool:
        """Close the episode in progress as truncated (its last observation is kept); returns whether
        there was one. For a writer that cannot continue the episode, such as a trainer resuming after
        a crash: the environment's state is gone, so the next ``add`` must start a new episode.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr", mode="a") as store:  # doctest: +SKIP
            ...     store.end_episode()
        """
        with self._mutex:
            self._require_writer("end the episode")
            if not self._episode_in_progress():
                return False
            ring = self.ring
            head = ring.added - 1
            move = (head - 1) % ring.capacity  # add() writes two steps per new episode, so head-1 exists
            ring.truncated[move] = True
            ring.is_last[head % ring.capacity] = True
            ring.dirty_shards.update({move // ring.shard_len, (head % ring.capacity) // ring.shard_len})
            self._head_obs = None
            return True

    def flush(self) -> None:
        """Make everything added so far durable; readers opened afterwards see it."""
        with self._mutex:
            self._require_writer("flush").flush()
