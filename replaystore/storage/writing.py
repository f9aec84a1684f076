"""The writing half of ``ReplayStore``: ``add``, ``add_batch``, ``end_episode``, ``load_steps`` and ``flush``. A
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

from replaystore.errors import ConfigError, InvalidTransitionError, ReadOnlyError, StoreWriteError
from replaystore.format.schema import Schema
from replaystore.format.validate import (
    check_action,
    check_flag,
    check_obs,
    check_reward,
    check_rows,
)
from replaystore.sampling.priority import Priorities
from replaystore.storage.rings import Rings
from replaystore.storage.stream import Stream
from replaystore.storage.writer import Writer

AUTORESET_MODES = {"next_step": "next_step", "nextstep": "next_step", "same_step": "same_step",
                   "samestep": "same_step", "disabled": "disabled"}


class Writing:
    """Writing methods of ``ReplayStore`` (see store.py for the attributes they use)."""

    path: Path
    schema: Schema
    rings: Rings
    streams: list[Stream]
    writing: list[int]
    _mutex: threading.RLock
    _priorities: Priorities
    _check_open: Callable[[], None]

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any) -> None:
        """Add one transition ``(obs, action, reward, next_obs, terminated, truncated)``.

        ``obs`` must equal the previous transition's ``next_obs`` unless that one ended the episode.
        Each observation is stored once. Nothing is changed if any argument is rejected. A store
        of several streams takes ``add`` when exactly one stream is open for writing here
        (``ReplayStore.open(path, mode="a", streams=[k])``); else use ``add_batch``.
        """
        with self._mutex:
            stream = self._only_stream("add")
            obs_a = check_obs(self.schema, self.path, obs, "obs")
            next_a = check_obs(self.schema, self.path, next_obs, "next_obs")
            act = check_action(self.schema, self.path, action)
            rew = check_reward(reward)
            term = check_flag(terminated, "terminated")
            trunc = check_flag(truncated, "truncated")
            self._check_continues(stream, obs_a, "obs")
            self._add(stream, obs_a, act, rew, next_a, term, trunc)

    def add_batch(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                  info: Mapping[str, Any] | None = None, *, autoreset_mode: Any = "next_step",
                  env_done: Any = None) -> None:
        """Add one move to each stream this store writes, from a vector env's step: row ``i`` of
        every argument goes to stream ``store.writing[i]`` (all of them, in order, for a store
        created with ``num_streams`` or opened without ``streams=``). The loop is exactly what the
        vector env returns::

            next_obs, reward, terminated, truncated, info = envs.step(actions)
            store.add_batch(obs, actions, reward, next_obs, terminated, truncated)
            obs = next_obs

        ``autoreset_mode`` says how the vector env starts a new episode in a sub-env whose episode
        ended (gymnasium's ``envs.metadata["autoreset_mode"]``; a string or the enum):

        ``"next_step"`` (gymnasium 1.x's default, and ale-py's ``AtariVectorEnv``)
            the step after the one that ended an episode is the reset: its row is recognised
            (``obs`` is the last observation of the episode) and skipped; the next episode starts
            from that row's ``next_obs``.
        ``"same_step"``
            the step that ends an episode already returns the reset observation in ``next_obs``;
            the true last observation is in ``info["final_obs"]``, so pass ``info``.
        ``"disabled"``
            you reset ended sub-envs yourself (``envs.reset(options={"reset_mask": done})``) and
            pass the reset observations as the next call's ``obs``.

        ``env_done`` (next-step mode): the rows whose sub-env really ended its episode, when that
        differs from ``terminated | truncated``: a learner that ends its episodes at a lost life
        while the game goes on passes ``terminated=life_lost | terminated`` and
        ``env_done=terminated | truncated`` as the env returned them.

        Every row is checked before anything is written: a bad row raises an error naming the
        field and the row, and no stream changes. Each stream's move is all-or-nothing under
        write errors (as ``add``); a ``StoreWriteError`` names the stream it failed on and the
        streams that kept their move (those before it in ``store.writing``; the others did not change).
        """
        mode = _autoreset_mode(autoreset_mode)
        with self._mutex:
            self._check_open()
            if not self.writing:
                raise ReadOnlyError(f"cannot add: {self.path} is open read-only; open it with mode='a' to append")
            n = len(self.writing)
            obs_a, act, rew, next_a, term, trunc = check_rows(self.schema, self.path, n, obs, action, reward, next_obs,
                                                              terminated, truncated)
            done = [t or u for t, u in zip(term, trunc)]
            ended = done
            if env_done is not None:
                flags = np.asarray(env_done)
                if flags.shape != (n,) or flags.dtype.kind not in "biu":
                    raise InvalidTransitionError(f"env_done is {env_done!r}; it must hold {n} bools, one per stream")
                ended = [bool(x) for x in flags.tolist()]
            if mode == "same_step" and any(done):
                next_a = self._final_obs(info, next_a, np.array(done))
            reset_rows = []
            for i, k in enumerate(self.writing):  # every row checked before any is written
                stream = self.streams[k]
                if mode == "next_step" and stream.reset_next is not None and not (
                        stream.reset_optional and (done[i] or not _same(obs_a[i], stream.reset_next))):
                    _check_reset_row(stream, i, obs_a[i], done[i] or ended[i], self.path)
                    reset_rows.append(i)
                else:
                    self._check_continues(stream, obs_a[i], f"obs[{i}]")
            kept: list[int] = []
            for i, k in enumerate(self.writing):
                stream = self.streams[k]
                if reset_rows and i in reset_rows:
                    stream.reset_next, stream.reset_optional = None, False
                    continue
                try:
                    self._add(stream, obs_a[i], act[i], rew[i], next_a[i], term[i], trunc[i])
                except StoreWriteError as exc:
                    raise StoreWriteError(exc.errno, f"stream {k} (row {i}): {exc.strerror or exc}; streams {kept} kept "
                                          "this move, the others did not change") from exc
                kept.append(k)
                if mode == "next_step" and ended[i]:
                    stream.reset_next = next_a[i].copy()

    def _final_obs(self, info: Mapping[str, Any] | None, next_a: np.ndarray, done: np.ndarray) -> np.ndarray:
        """``next_obs`` with the rows that ended an episode replaced by ``info["final_obs"]`` (same-step autoreset)."""
        if info is None or "final_obs" not in info:
            raise InvalidTransitionError(
                "autoreset_mode='same_step' and an episode ended, but info has no 'final_obs'; pass the info "
                "returned by envs.step (its final_obs holds the true last observations)")
        final = info["final_obs"]
        mask = np.asarray(info.get("_final_obs", done))
        out = next_a.copy()
        for i in np.flatnonzero(done).tolist():
            if not bool(mask[i]) or final[i] is None:
                raise InvalidTransitionError(f"row {i} ended its episode but info['final_obs'][{i}] is missing")
            out[i] = check_obs(self.schema, self.path, final[i], f"info['final_obs'][{i}]")
        return out

    def _check_continues(self, stream: Stream, obs_a: np.ndarray, name: str) -> None:
        if stream.head_obs is not None and not _same(obs_a, stream.head_obs):
            where = f" (stream {stream.index})" if self.schema.num_streams > 1 else ""
            raise InvalidTransitionError(
                f"{name} does not continue the episode in progress in {self.path}{where}: it differs from the previous "
                "transition's next_obs; pass that next_obs as obs, or end the episode (terminated or truncated) "
                "before starting a new one"
            )

    def _add(self, stream: Stream, obs_a: np.ndarray, act: int, rew: float, next_a: np.ndarray, term: bool,
             trunc: bool) -> None:
        """One checked move into ``stream``: all or nothing."""
        writer = _writer(stream)
        ring = stream.ring
        in_progress = stream.head_obs is not None  # (kept for exactly the streams with an episode in progress)
        frames = [ring.added, ring.added + 1] if not in_progress else [ring.added]
        # Writing reaches the disk only when a frame falls outside the writer's shard (once a shard):
        # then keep what this call changes, so that a failed write can put it all back.
        undo = self._undo_point(stream, frames) if writer.writes_for(frames) else None
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
        stream.head_obs = None if done else next_a.copy()
        stream.reset_next, stream.reset_optional = None, False

    def _undo_point(self, stream: Stream, frames: list[int]) -> Callable[[], None]:
        """A function that puts back everything in RAM an ``add`` writing ``frames`` can change: the
        steps it adds, the move before them, the old steps it retires (and the stacks that reached
        them), the counters, and the writer's buffer. The disk needs no undoing: a commit that fails
        leaves the last committed state in place, and every step it calls live is still whole on
        disk (a shard rewritten before the failure holds the same live steps; storage/writer.py)."""
        ring, writer = stream.ring, _writer(stream)
        lo = ring.lo
        positions = np.r_[frames[0] - 1 : frames[-1] + 1, lo : lo + len(frames) + ring.frame_stack].astype(np.int64)
        slots = np.unique(positions[positions >= 0] % ring.capacity)
        saved = {name: values[slots].copy() for name, values in ring.fields.items()}
        valid = ring.valid[slots].copy()
        counters = (ring.added, ring.oldest, ring.n_valid, set(ring.dirty_shards), set(ring.dirty_priority_shards))
        head_obs = stream.head_obs
        restore_writer = writer.undo_point(frames)

        def undo() -> None:
            for name, values in ring.fields.items():
                values[slots] = saved[name]
            ring.valid[slots] = valid
            ring.added, ring.oldest, ring.n_valid = counters[:3]
            ring.dirty_shards, ring.dirty_priority_shards = set(counters[3]), set(counters[4])
            stream.head_obs = head_obs
            restore_writer()

        return undo

    def load_steps(self, scalars: Mapping[str, np.ndarray], frame_blocks: Iterable[np.ndarray], *,
                   stream: int | None = None) -> None:
        """Fill this new, empty store (or stream ``stream`` of it) with whole steps at positions
        ``0 .. n-1`` (``compact`` copies a store's live steps this way): ``scalars`` holds every
        per-step field of ``SCALAR_FIELDS`` for the ``n`` steps, ``frame_blocks`` yields their
        observations in order, a block at a time. Episodes keep their ``ep_step``, so stacks and
        n-step returns are what they were; an episode left in progress at the end is continued by
        the next ``add``. The steps are not validated again: they come from a verified store. Call
        ``flush`` to commit them.
        """
        with self._mutex:
            target = self._only_stream("load steps") if stream is None else self.streams[stream]
            writer = _writer(target)
            ring = target.ring
            n = len(scalars["ep_step"])
            if ring.added or n > ring.capacity or any(len(scalars[name]) != n for name in ring.fields):
                raise ConfigError(f"load_steps fills an empty stream with at most {ring.capacity} steps and every "
                                  f"per-step field of the same length; {self.path} holds {ring.added} steps there and "
                                  f"{n} were given")
            for name, values in ring.fields.items():
                values[:n] = scalars[name]
            ring.added = n
            ring.dirty_shards.update(range(-(-max(n, 1) // ring.shard_len)))
            ring.rebuild_valid()
            self._priorities = Priorities(self.rings)
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
                target.head_obs = writer.frame_at(n - 1)

    def end_episode(self) -> bool:
        """Close the episode in progress in each stream this store writes as truncated (its last
        observation is kept); returns whether there was one. For a writer that cannot continue the
        episode, such as a trainer resuming after a crash: the environment's state is gone, so the
        next ``add`` must start a new episode.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr", mode="a") as store:  # doctest: +SKIP
            ...     store.end_episode()
        """
        with self._mutex:
            self._check_open()
            if not self.writing:
                raise ReadOnlyError(f"cannot end the episode: {self.path} is open read-only; open it with mode='a'")
            ended = False
            for k in self.writing:
                stream = self.streams[k]
                stream.reset_next, stream.reset_optional = None, False
                if not stream.episode_in_progress():
                    continue
                ring = stream.ring
                head = ring.added - 1
                move = (head - 1) % ring.capacity  # add() writes two steps per new episode, so head-1 exists
                ring.truncated[move] = True
                ring.is_last[head % ring.capacity] = True
                ring.dirty_shards.update({move // ring.shard_len, (head % ring.capacity) // ring.shard_len})
                stream.head_obs = None
                ended = True
            return ended

    def flush(self) -> None:
        """Make everything added so far durable; readers opened afterwards (or refreshed) see it."""
        with self._mutex:
            self._check_open()
            if not self.writing:
                raise ReadOnlyError(f"cannot flush: {self.path} is open read-only; open it with mode='a' to append")
            for k in self.writing:
                _writer(self.streams[k]).flush()

    def _only_stream(self, what: str) -> Stream:
        """The one stream ``add`` writes (raises unless exactly one is open for writing)."""
        self._check_open()
        if not self.writing:
            raise ReadOnlyError(f"cannot {what}: {self.path} is open read-only; open it with mode='a' to append")
        if len(self.writing) > 1:
            raise ConfigError(
                f"cannot {what}: {self.path} is open for writing {len(self.writing)} streams ({self.writing}); use "
                "add_batch with one row per stream, or open one stream: ReplayStore.open(path, mode='a', streams=[k])")
        return self.streams[self.writing[0]]


def _writer(stream: Stream) -> Writer:
    assert stream.writer is not None
    return stream.writer


def _autoreset_mode(mode: Any) -> str:
    key = str(getattr(mode, "value", mode)).lower()
    if key not in AUTORESET_MODES:
        raise ConfigError(f"autoreset_mode is {mode!r}; use 'next_step' (gymnasium's default), 'same_step' or "
                          "'disabled', or pass envs.metadata['autoreset_mode']")
    return AUTORESET_MODES[key]


def _check_reset_row(stream: Stream, i: int, obs: np.ndarray, done: bool, path: Path) -> None:
    """A next-step autoreset row: the sub-env returns the reset observation and nothing else."""
    if done or not _same(obs, stream.reset_next):
        raise InvalidTransitionError(
            f"row {i} (stream {stream.index}) follows the end of an episode, so with autoreset_mode='next_step' it "
            "should be the vector env's reset step (obs = the previous row's next_obs, not done); it is not. If your "
            "vector env resets in the same step pass autoreset_mode='same_step' and info; if you reset ended envs "
            f"yourself pass autoreset_mode='disabled' ({path}; nothing was written)")


def _same(a: np.ndarray, b: np.ndarray | None) -> bool:
    """Whether two observations of the store's dtype are equal (NaN equals NaN): a byte compare
    where the bytes decide, ~6x cheaper than ``np.array_equal`` on an Atari frame."""
    if b is None:
        return False
    if a.dtype.kind in "biu":
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
