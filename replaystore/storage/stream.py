"""The moves written into one episode stream: what ``add`` does once its arguments are checked.

A ``StreamWriter`` owns its stream's ``ShardWriter`` (writer.py: the frame buffer and the commits)
and writes each move into the stream's ring (ring.py) and frame buffer, all or nothing: an ``add``
that fails while writing (a full disk) puts everything in RAM back as it was, and storage needs no
undoing (a commit that fails leaves the last one in place, and every step it calls live is still
whole). It also keeps what the next move must continue from: the observation of the episode in
progress, and after a vector env's episode end, the reset row to expect (rows.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from replaystore.errors import ConfigError
from replaystore.format.schema import Layout, Schema, State
from replaystore.storage.backend import Backend
from replaystore.storage.episteps import Loading
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import SHIFT, Rings
from replaystore.storage.writer import ShardWriter


class StreamWriter:
    """Writes stream ``index`` of ``rings``: its moves, its episode ends, and its commits."""

    def __init__(self, backend: Backend, schema: Schema, layout: Layout, rings: Rings, reader: FrameReader,
                 committed: State, *, index: int) -> None:
        self.index = index
        self.dict_spec = schema.observation_dict  # (a Dict store's frames: compared entry by entry, rows.same)
        self.rings = rings
        self.ring = rings.streams[index]
        self.reader = reader
        self.shards = ShardWriter(backend, schema, layout, self.ring, reader, committed, stream=index)
        self.head_obs: np.ndarray | None = None  # the next_obs the episode in progress continues from
        self.reset_next: np.ndarray | None = None  # next-step autoreset: the last obs of the episode just ended
        self.reset_optional = False  # reset_next as found on open: the next row may be the reset, or a fresh env's first
        ring = self.ring
        if self.episode_in_progress():
            self.head_obs = self.frame_at(ring.added - 1)
        elif ring.added:  # a vector env that goes on after an episode end sends its reset row next
            self.reset_next, self.reset_optional = self.frame_at(ring.added - 1), True

    @property
    def committed(self) -> State:
        """The stream's last commit."""
        return self.shards.committed

    @property
    def episodes(self) -> int:
        """Episodes ever started in the stream (committed or not)."""
        return self.shards.episodes

    def episode_in_progress(self) -> bool:
        ring = self.ring
        return ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])

    def frame_at(self, position: int) -> np.ndarray:
        """The stored observation of the stream's step ``position``."""
        return np.array(self.reader.gather(np.array([self.index << SHIFT | position], dtype=np.int64))[0])

    def flush(self) -> None:
        self.shards.flush()

    # ---------------------------------------------------------------------------------------------
    # Moves

    def add(self, obs: np.ndarray, action: int | np.ndarray, reward: float, next_obs: np.ndarray, terminated: bool,
            truncated: bool, extras: dict[str, np.ndarray] | None = None) -> None:
        """One checked move (``extras``: field -> value, validate.check_extras): all or nothing."""
        writer, ring = self.shards, self.ring
        in_progress = self.head_obs is not None  # (kept for exactly the streams with an episode in progress)
        frames = [ring.added, ring.added + 1] if not in_progress else [ring.added]
        # Writing reaches storage only when a frame falls outside the writer's shard (once a shard):
        # then keep what this call changes, so that a failed write can put it all back. Otherwise
        # ``ready`` does the one thing that can fail (opening a stored chunk that does not decode) first.
        undo = self._undo_point(frames) if writer.ready(frames) else None
        try:
            if not in_progress:
                writer.put_frame(ring.added, obs)
                ring.append_step(0, False)
                writer.episodes += 1
            head = ring.added - 1
            ring.set_move(head, action, reward, terminated, truncated, extras)
            ring.priority[head % ring.capacity] = self.rings.new_priority
            writer.put_frame(ring.added, next_obs)
            done = terminated or truncated
            ring.append_step(ring.ep_step.of(head) + 1, done)
            ring.mark_transition(head)
        except BaseException:
            if undo is not None:
                undo()
            raise
        self.head_obs = None if done else next_obs.copy()
        self.reset_next, self.reset_optional = None, False

    def _undo_point(self, frames: list[int]) -> Callable[[], None]:
        """A function that puts back everything in RAM an ``add`` writing ``frames`` can change: the
        steps it adds, the move before them, the old steps it retires (and the stacks that reached
        them), the counters, and the frame buffer."""
        ring = self.ring
        lo = ring.lo
        positions = np.r_[frames[0] - 1 : frames[-1] + 1, lo : lo + len(frames) + ring.frame_stack].astype(np.int64)
        slots = np.unique(positions[positions >= 0] % ring.capacity)
        saved = {name: values[slots].copy() for name, values in ring.fields.items() if name != "ep_step"}
        starts = ring.ep_step.snapshot()
        valid = ring.valid[slots].copy()
        counters = (ring.added, ring.oldest, ring.n_valid, set(ring.dirty_shards), set(ring.dirty_priority_shards))
        head_obs = self.head_obs
        restore_writer = self.shards.undo_point(frames)

        def undo() -> None:
            for name, value in saved.items():
                ring.fields[name][slots] = value
            ring.ep_step.restore(starts)
            ring.valid[slots] = valid
            ring.added, ring.oldest, ring.n_valid = counters[:3]
            ring.dirty_shards, ring.dirty_priority_shards = set(counters[3]), set(counters[4])
            self.head_obs = head_obs
            restore_writer()

        return undo

    def end_episode(self) -> bool:
        """Close the episode in progress as truncated (its last observation is kept); returns whether
        there was one."""
        self.reset_next, self.reset_optional = None, False
        if not self.episode_in_progress():
            return False
        ring = self.ring
        head = ring.added - 1
        move = (head - 1) % ring.capacity  # add() writes two steps per new episode, so head-1 exists
        ring.truncated[move] = True
        ring.is_last[head % ring.capacity] = True
        ring.dirty_shards.update({move // ring.shard_len, (head % ring.capacity) // ring.shard_len})
        self.head_obs = None
        return True

    def load_steps(self, scalars: Mapping[str, np.ndarray], frame_blocks: Iterable[np.ndarray], where: str) -> None:
        """Fill this empty stream with whole steps (see ``ReplayStore.load_steps``)."""
        ring, writer = self.ring, self.shards
        n = len(scalars["ep_step"])
        if ring.added or n > ring.capacity or any(len(scalars[name]) != n for name in ring.fields):
            raise ConfigError(f"load_steps fills an empty stream with at most {ring.capacity} steps and every "
                              f"per-step field of the same length; {where} holds {ring.added} steps there and "
                              f"{n} were given")
        loading = Loading(ring.ep_step, 0, fresh=True)
        loading.feed(np.asarray(scalars["ep_step"]))
        if loading.broken:
            ring.ep_step.clear()
            raise ConfigError(f"load_steps was given an ep_step that does not count up within episodes (step "
                              f"{loading.first_broken}); each step's is 0 or the step before's plus 1")
        for name, values in ring.fields.items():
            if name != "ep_step":
                values[:n] = scalars[name]
        ring.added = n
        ring.dirty_shards.update(range(-(-max(n, 1) // ring.shard_len)))
        ring.rebuild_valid()
        writer.episodes = int(ring.ep_step.starts.size)  # (one begun before step 0 has a virtual start)
        position = 0
        for block in frame_blocks:
            for frame in block:
                writer.put_frame(position, frame)
                position += 1
        if position != n:
            raise ConfigError(f"load_steps was given {n} steps of scalars but {position} frames")
        if n and not ring.is_last[n - 1]:
            self.head_obs = self.frame_at(n - 1)
