"""What goes into the store, as one part of the facade: ``Writing``, the methods that add moves
(``add``, ``add_batch``), close episodes, commit (``flush``), fill a new store (``load_steps``) and
follow other writers (``refresh``). ``ReplayStore`` (facade.py) holds one and hands these methods to
it (parts.py's ``delegated``); each holds the store's lock while it changes anything."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, ReadOnlyError
from replaystore.format.extras import check_extras
from replaystore.format.validate import check_action, check_flag, check_obs, check_reward, check_rows
from replaystore.sampling.priority import Priorities
from replaystore.storage.rows import add_rows, check_continues, final_extras
from replaystore.storage.rows import autoreset_mode as parse_autoreset
from replaystore.storage.stream import StreamWriter
from replaystore.store.parts import Parts


class Writing:
    """The writing half of ``ReplayStore``: it holds the store's ``Parts`` (parts.py) and nothing else."""

    def __init__(self, parts: Parts) -> None:
        self._p = parts

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, *,
            extras: Mapping[str, Any] | None = None) -> None:
        """Add one transition ``(obs, action, reward, next_obs, terminated, truncated)``.

        ``action``: an int of a ``Discrete`` store's range, or an array of a ``Box`` store's shape
        within its bounds. ``obs`` must equal the previous transition's ``next_obs`` unless that one
        ended the episode. ``extras``: the move's value of each extra the store was created with (a
        dict, or the env's ``info`` holding them; format/extras.py).
        Each observation is stored once. Nothing is changed if any argument is rejected. A store
        of several streams takes ``add`` when exactly one stream is open for writing here
        (``ReplayStore.open(path, mode="a", streams=[k])``); else use ``add_batch``.
        """
        with self._p.mutex:
            writer = self._only_writer("add")
            obs_a = check_obs(self._p.schema, self._p.path, obs, "obs")
            next_a = check_obs(self._p.schema, self._p.path, next_obs, "next_obs")
            act = check_action(self._p.schema, self._p.path, action)
            rew = check_reward(reward)
            term = check_flag(terminated, "terminated")
            trunc = check_flag(truncated, "truncated")
            extra = check_extras(self._p.schema.extras, extras, self._p.path)
            check_continues(writer, obs_a, "obs", self._p.path)
            writer.add(obs_a, act, rew, next_a, term, trunc, extra)

    def add_batch(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                  info: Mapping[str, Any] | None = None, *, autoreset_mode: Any = "next_step",
                  env_done: Any = None, skip: Iterable[int] = (), extras: Mapping[str, Any] | None = None,
                  streams: Iterable[int] | None = None) -> None:
        """Add one move to each stream this store writes, from a vector env's step: row ``i`` of
        every argument goes to stream ``store.writing[i]``, exactly as the vector env returns it::

            next_obs, reward, terminated, truncated, info = envs.step(actions)
            store.add_batch(obs, actions, reward, next_obs, terminated, truncated)
            obs = next_obs

        ``autoreset_mode`` (gymnasium's ``envs.metadata["autoreset_mode"]``): ``"next_step"`` (the
        default; the reset row after an episode end is recognised and skipped), ``"same_step"``
        (pass ``info``: its ``final_obs`` holds the true last observations) or ``"disabled"`` (you
        reset ended sub-envs and pass the reset observations as the next ``obs``). ``env_done``
        (next-step mode): the rows whose sub-env really ended, when that differs from
        ``terminated | truncated`` (episodes that end at a lost life). ``skip``: rows that carry no
        move and are not written (a wrapper that recognised its env's reset rows itself; their
        values are still checked). ``extras``: each extra's rows, as for ``add`` (a vector env's
        ``info`` holding them; with same-step autoreset an ended row's are taken from its
        ``final_info``). ``streams``: the rows go to these streams only, given as rows of a whole
        step (0 is the first stream written here; row ``i`` goes to ``store.writing[streams[i]]``),
        for a vector env stepped a part at a time (the trainer's two halves in turn). docs/streams.md
        has the details.

        Every row is checked before anything is written; each stream's move is all or nothing, and a
        ``StoreWriteError`` names the stream it failed on and those that kept their move.
        """
        mode = parse_autoreset(autoreset_mode)
        with self._p.mutex:
            self._writable("add")
            writers = self._p.writers if streams is None else self._part(streams)
            n = len(writers)
            rows = check_rows(self._p.schema, self._p.path, n, obs, action, reward, next_obs, terminated, truncated)
            extra = check_extras(self._p.schema.extras, final_extras(extras, n) if mode == "same_step" else extras,
                                 self._p.path, (n,))
            skipped = frozenset(int(i) for i in skip)
            if any(not 0 <= i < n for i in skipped):
                raise ConfigError(f"skip is {sorted(skipped)}; rows are 0..{n - 1}")
            add_rows(writers, self._p.schema, self._p.path, rows, mode=mode, env_done=env_done, info=info,
                     skip=skipped, extras=extra)

    def _part(self, streams: Iterable[int]) -> list[Any]:
        """The writers of ``streams`` (rows of a whole step), each once; ConfigError otherwise."""
        rows = [int(i) for i in streams]
        n = len(self._p.writers)
        if any(not 0 <= i < n for i in rows) or len(set(rows)) != len(rows):
            raise ConfigError(f"streams is {rows!r}; it must name distinct rows of the {n} streams this store "
                              f"writes, 0..{n - 1}; nothing was written")
        return [self._p.writers[i] for i in rows]

    def end_episode(self, streams: Iterable[int] | None = None) -> bool:
        """Close the episode in progress in each stream this store writes (or in ``streams``, given
        as rows of ``add_batch``: 0 is the first stream written here) as truncated (its last
        observation is kept); returns whether there was one. For a writer that cannot continue the
        episode, such as a trainer resuming after a crash: the environment's state is gone, so the
        next ``add`` must start a new episode.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr", mode="a") as store:  # doctest: +SKIP
            ...     store.end_episode()
        """
        with self._p.mutex:
            self._writable("end the episode")
            writers = self._p.writers if streams is None else self._part(streams)
            return any([writer.end_episode() for writer in writers])

    def flush(self) -> None:
        """Make everything added so far durable; readers opened afterwards (or refreshed) see it."""
        with self._p.mutex:
            self._writable("flush")
            for writer in self._p.writers:
                writer.flush()

    def load_steps(self, scalars: Mapping[str, np.ndarray], frame_blocks: Iterable[np.ndarray], *,
                   stream: int | None = None) -> None:
        """Fill this new, empty store (or stream ``stream`` of it) with whole steps at positions
        ``0 .. n-1`` (``compact`` copies a store's live steps this way): ``scalars`` holds every
        per-step field of ``SCALAR_FIELDS`` (and each extra, as ``extras/<name>``) for the ``n``
        steps, ``frame_blocks`` yields their
        observations in order, a block at a time. Episodes keep their ``ep_step``, so stacks and
        n-step returns are what they were; an episode left in progress at the end is continued by
        the next ``add``. The steps are not validated again: they come from a verified store. Call
        ``flush`` to commit them.
        """
        with self._p.mutex:
            writer = self._only_writer("load steps") if stream is None else self._writable_stream(stream)
            writer.load_steps(scalars, frame_blocks, str(self._p.path))
            self._p.priorities = Priorities(self._p.rings)
            self._p.samplers.clear()  # (prioritized ones hold the old priorities)

    def refresh(self) -> list[int]:
        """Catch up with what writers in other processes committed since this store was opened (or
        last refreshed): the streams this store does not write are brought to their latest commit,
        reading only their new scalar shards and reopening only the frame shards they rewrote.
        Batches planned before keep reading the files they were planned on. Returns the streams
        that moved.

        Example:
            >>> reader = ReplayStore.open("/tmp/doc.zarr")  # doctest: +SKIP
            >>> reader.refresh()  # doctest: +SKIP
            [0]
        """
        with self._p.mutex:
            self._p.check_open()
            moved = []
            for k in range(self._p.num_streams):
                if k in self._p.by_stream:
                    continue
                first = self._p.view.refresh(k)
                if first is not None:
                    self._p.priorities.adopt(k, first)
                    moved.append(k)
            return moved

    def _writable(self, what: str) -> None:
        self._p.check_open()
        if not self._p.writers:
            raise ReadOnlyError(f"cannot {what}: {self._p.path} is open read-only; open it with mode='a' to append")

    def _writable_stream(self, k: int) -> StreamWriter:
        self._writable("write")
        if k not in self._p.by_stream:
            raise ConfigError(f"stream {k} of {self._p.path} is not open for writing here; it writes {self._p.writing}")
        return self._p.by_stream[k]

    def _only_writer(self, what: str) -> StreamWriter:
        """The one stream ``add`` writes (raises unless exactly one is open for writing)."""
        self._writable(what)
        if len(self._p.writers) > 1:
            raise ConfigError(
                f"cannot {what}: {self._p.path} is open for writing {len(self._p.writing)} streams ({self._p.writing}); use "
                "add_batch with one row per stream, or open one stream: ReplayStore.open(path, mode='a', streams=[k])")
        return self._p.writers[0]
