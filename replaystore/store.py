"""ReplayStore: the public face, a thin facade over its parts. It checks arguments, takes its lock, and
hands the work to the part whose job it is:

    backend   storage/backend.py    where the bytes live: files (storage/local) or objects (storage/objects)
    rings     storage/rings.py      every stream's per-step scalars in RAM, and what is sampleable
    view      storage/view.py       the commits read, and following writers in other processes (refresh)
    writers   storage/stream.py     one per stream written here: moves, episode ends, commits
    reader    storage/reader.py     chunk-aware frame reads with a compressed-chunk cache
    samplers  sampling/samplers.py  which steps a batch holds (uniform, prioritized, sequences,
                                    hindsight relabelling: sampling/hindsight.py)
    feeds     feed/                 blocks of batches drawn ahead, for numpy, tf.data and JAX

docs/design.md draws how they fit together.

Example:
    >>> import gymnasium as gym, numpy as np
    >>> from replaystore import ReplayStore, Layout
    >>> env = gym.make("CartPole-v1")
    >>> with ReplayStore.create("/tmp/doc.zarr", capacity=64, observation_space=env.observation_space,
    ...                         action_space=env.action_space, frame_stack=2, overwrite=True,
    ...                         layout=Layout(shard_len=16, obs_chunk_len=4)) as store:
    ...     obs, _ = env.reset(seed=0)
    ...     for _ in range(40):
    ...         nxt, r, term, trunc, _ = env.step(env.action_space.sample())
    ...         store.add(obs, 0, r, nxt, term, trunc)
    ...         obs = nxt if not (term or trunc) else env.reset()[0]
    >>> ReplayStore.open("/tmp/doc.zarr").sample(8, rng=np.random.default_rng(0)).obs.shape
    (8, 2, 4)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import numpy as np

from replaystore.errors import ConfigError, ReadOnlyError, StoreClosedError
from replaystore.format.extras import check_extras
from replaystore.format.schema import (
    Layout,
    State,
    stream_stride,
)
from replaystore.format.validate import (
    check_action,
    check_flag,
    check_obs,
    check_reward,
    check_rows,
    check_streams,
    new_schema,
)
from replaystore.sampling.assemble import Batch
from replaystore.sampling.episodes import Episode, episode_table, plan_episode, plan_span, stream_ring
from replaystore.sampling.memory import DEFAULT_CACHE_BYTES, check_budget, check_config, default_cache_bytes, estimate
from replaystore.sampling.pending import Pending
from replaystore.sampling.priority import Priorities, check_priorities, check_slots
from replaystore.sampling.samplers import PrioritizedSampler, Sampler, UniformSampler, check_batch_size
from replaystore.sampling.sequences import SequenceBatch, SequenceSampler
from replaystore.storage.backend import Backend
from replaystore.storage.choose import is_url, open_backend
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.rings import Rings
from replaystore.storage.rows import add_rows, check_continues
from replaystore.storage.rows import autoreset_mode as parse_autoreset
from replaystore.storage.stream import StreamWriter
from replaystore.storage.view import View

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_CACHE_BYTES", "ReplayStore"]

#: The defaults of the arguments that describe a sampler (``sampler=`` replaces them all).
_SAMPLER_DEFAULTS: dict[str, Any] = {"n_step": 1, "gamma": 0.99, "prioritized": False, "alpha": 0.6, "beta": 0.4,
                                     "sequence_length": None}


class ReplayStore:
    """A disk-backed replay buffer of steps in a zarr v3 group, in one or more episode streams.

    Use ``ReplayStore.create`` or ``ReplayStore.open``; see the module docstring for an example.
    """

    def __init__(self, backend: Backend, *, writing: list[int], cache_bytes: int, decode_threads: int = 1,
                 memory_budget: int | None = None) -> None:
        """Assemble a store over ``backend``, whose metadata is read and whose ``writing`` streams this
        process has claimed (``create`` and ``open`` do that)."""
        schema, layout = backend.schema, backend.layout
        assert schema is not None and layout is not None
        self.backend = backend
        self.path: str | Path = backend.where if is_url(backend.where) else Path(backend.where)
        self.schema = schema
        self.layout = layout
        self.writing = sorted(writing)  # the streams this store writes, in the order add_batch takes them
        self.mode = "a" if writing else "r"
        self._closed = False
        self._memory_budget = memory_budget
        self._prefetchers: weakref.WeakSet[Any] = weakref.WeakSet()  # live ones: their RAM is the store's too
        # Guards the rings, the writers and the reader's caches: ``add``/``flush`` and the planning half of
        # sampling hold it; decoding frames does not (see reader.py), so samplers on other threads
        # (``as_dataset``) and the acting thread's ``add`` mostly run side by side.
        self._mutex = threading.RLock()
        self.rings = Rings(schema.num_streams, schema.stream_capacity, stream_stride(schema, layout),
                           schema.frame_stack, layout.shard_len, schema.action,
                           zero_padding=schema.frame_padding == "zero", extras=schema.extras)
        self.reader = FrameReader(backend.frames, schema, layout, cache_bytes=cache_bytes,
                                  decode_threads=decode_threads, slots_of=self.rings.slots)
        self._view = View(backend, layout, self.rings, self.reader)
        self._view.load(self.writing)
        self._writers = [StreamWriter(backend, schema, layout, self.rings, self.reader, self._view.states[k], index=k)
                         for k in self.writing]
        self._by_stream = {w.index: w for w in self._writers}
        if self._writers:
            writers = tuple(self._writers)
            self.reader.live_regions = lambda: [r for w in writers if (r := w.shards.live_region()) is not None]
            backend.keep_claims()
        self._priorities = Priorities(self.rings)  # the prioritized samplers' state
        self._samplers: dict[tuple, Sampler] = {}
        # Closes what this store holds if it is dropped without close(). It refers to the parts only,
        # never to the store, so it does not keep the store alive (and the parts do not refer to it).
        self._finalizer = weakref.finalize(self, _release, tuple(self._writers), self.reader, backend, str(self.path))

    # ---------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def create(cls, path: str | Path, capacity: int, observation_space: Any, action_space: Any, frame_stack: int = 1, *,
               layout: Layout | None = None, overwrite: bool = False, cache_bytes: int | None = None,
               memory_budget: int | None = None, decode_threads: int = 1, num_streams: int = 1,
               frame_padding: str = "reset", storage_options: dict[str, Any] | None = None,
               extras: Mapping[str, Any] | None = None) -> ReplayStore:
        """Create a store for ``capacity`` steps and open it for appending.

        ``observation_space`` is a gymnasium ``Box``, or a ``Dict`` of ``Box`` entries (goal-conditioned
        envs: ``add`` takes the env's dicts and sampled observations are dicts of stacks, each step's
        entries kept together in one frame, format/dictobs.py); ``action_space`` a ``Discrete`` (one
        int a step) or a ``Box`` (continuous control: an array of its shape a step, sampled back in
        its dtype).

        A sampled observation is a stack of ``frame_stack`` frames, oldest first; before its
        episode's first step a stack holds that first frame again (``frame_padding="reset"``, as
        gymnasium's ``FrameStackObservation`` does) or zeros (``"zero"``, as SB3's ``VecFrameStack``).

        ``extras``: more per-move fields to keep beside the action and reward, name -> a dtype (one
        value a move), a ``(shape, dtype)`` pair or a gymnasium ``Box``, such as ``{"is_success":
        "bool", "logp": "float32"}``; every ``add`` then gives them (``extras=``) and sampled
        batches carry them (``batch.extras[name]``). At most 4 KB a move: they live in RAM with the
        other per-step fields (format/extras.py, docs/sampling.md).

        ``num_streams`` > 1 makes a store of that many episode streams (one per environment of a
        vector env; see ``add_batch``), each a ring of ``capacity / num_streams`` steps. RAM: see
        ``memory_estimate``; with ``memory_budget`` (bytes) a configuration whose estimate
        exceeds it is refused before anything is written. ``cache_bytes``: the compressed-chunk
        cache; by default 256 MB, or a quarter of ``memory_budget`` or of the memory this process
        may use where that is below 1 GB. ``decode_threads`` > 1 decodes each batch's
        chunks on that many threads.

        ``path`` may be a URL, ``s3://bucket/prefix/replay.zarr`` (any S3-compatible server: the
        endpoint and credentials come from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... or from
        ``storage_options``, which also takes ``lease_ttl`` and ``gc_grace`` in seconds; see
        docs/objects.md).

        Example:
            >>> store = ReplayStore.create("/tmp/doc2.zarr", 4096, gym.spaces.Box(0, 255, (84, 84), np.uint8),
            ...                            gym.spaces.Discrete(4), frame_stack=4, overwrite=True)  # doctest: +SKIP
        """
        if cache_bytes is None:
            cache_bytes = default_cache_bytes(memory_budget)
        schema, layout = new_schema(capacity, observation_space, action_space, frame_stack, num_streams, layout,
                                    frame_padding, extras)
        n = schema.num_streams
        backend = open_backend(path, storage_options)
        check_config(schema, layout, backend.where, writable=n, cache_bytes=cache_bytes, memory_budget=memory_budget,
                     decode_threads=decode_threads)
        backend.create(schema, layout, overwrite=overwrite)
        log.info("created replay store %s (capacity %d, %d streams, layout %s)", backend.where, schema.capacity, n,
                 layout)
        return cls._assemble(backend, list(range(n)), cache_bytes, decode_threads, memory_budget)

    @classmethod
    def open(cls, path: str | Path, mode: str = "r", *, streams: Any = None, cache_bytes: int | None = None,
             memory_budget: int | None = None, decode_threads: int = 1,
             storage_options: dict[str, Any] | None = None) -> ReplayStore:
        """Open an existing store: ``mode="r"`` to read (any number of readers), ``"a"`` to append.

        ``streams`` (a store of streams, mode "a"): the indexes of the streams this process writes,
        default all of them; other processes may write the others at the same time (``refresh``
        shows what they committed). ``cache_bytes``, ``memory_budget``, ``decode_threads`` and a URL
        ``path`` with its ``storage_options`` are as for ``create``.

        Example:
            >>> store = ReplayStore.open("/tmp/doc.zarr")
            >>> len(store) > 0
            True
        """
        if mode not in ("r", "a"):
            raise ConfigError(f"mode is {mode!r}; use 'r' to read or 'a' to append")
        if cache_bytes is None:
            cache_bytes = default_cache_bytes(memory_budget)
        backend = open_backend(path, storage_options)
        schema, layout = backend.read_metadata()
        writing = check_streams(schema.num_streams, mode, streams, backend.where)
        check_config(schema, layout, backend.where, writable=len(writing), cache_bytes=cache_bytes,
                     memory_budget=memory_budget, decode_threads=decode_threads)
        try:
            for k in writing:
                backend.claim(k)
                backend.collect(k)
        except BaseException:
            backend.close()
            raise
        return cls._assemble(backend, writing, cache_bytes, decode_threads, memory_budget)

    @classmethod
    def _assemble(cls, backend: Backend, writing: list[int], cache_bytes: int, decode_threads: int,
                  memory_budget: int | None) -> ReplayStore:
        try:
            return cls(backend, writing=writing, cache_bytes=cache_bytes, decode_threads=decode_threads,
                       memory_budget=memory_budget)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        """Flush (when writing), release the writer claims and free file handles. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            try:
                for writer in self._writers:
                    writer.flush()
            finally:
                self._closed = True
                self._finalizer.detach()
                _release((), self.reader, self.backend, str(self.path))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # Writing

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
        with self._mutex:
            writer = self._only_writer("add")
            obs_a = check_obs(self.schema, self.path, obs, "obs")
            next_a = check_obs(self.schema, self.path, next_obs, "next_obs")
            act = check_action(self.schema, self.path, action)
            rew = check_reward(reward)
            term = check_flag(terminated, "terminated")
            trunc = check_flag(truncated, "truncated")
            extra = check_extras(self.schema.extras, extras, self.path)
            check_continues(writer, obs_a, "obs", self.path)
            writer.add(obs_a, act, rew, next_a, term, trunc, extra)

    def add_batch(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                  info: Mapping[str, Any] | None = None, *, autoreset_mode: Any = "next_step",
                  env_done: Any = None, skip: Iterable[int] = (), extras: Mapping[str, Any] | None = None) -> None:
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
        ``info`` holding them). docs/streams.md has the details.

        Every row is checked before anything is written; each stream's move is all or nothing, and a
        ``StoreWriteError`` names the stream it failed on and those that kept their move.
        """
        mode = parse_autoreset(autoreset_mode)
        with self._mutex:
            self._writable("add")
            rows = check_rows(self.schema, self.path, len(self._writers), obs, action, reward, next_obs, terminated,
                              truncated)
            extra = check_extras(self.schema.extras, extras, self.path, (len(self._writers),))
            skipped = frozenset(int(i) for i in skip)
            if any(not 0 <= i < len(self._writers) for i in skipped):
                raise ConfigError(f"skip is {sorted(skipped)}; rows are 0..{len(self._writers) - 1}")
            add_rows(self._writers, self.schema, self.path, rows, mode=mode, env_done=env_done, info=info,
                     skip=skipped, extras=extra)

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
        with self._mutex:
            self._writable("end the episode")
            writers = self._writers
            if streams is not None:
                rows = [int(i) for i in streams]
                if any(not 0 <= i < len(writers) for i in rows):
                    raise ConfigError(f"streams is {rows!r}; this store writes {len(writers)} streams, rows 0.."
                                      f"{len(writers) - 1}")
                writers = [writers[i] for i in rows]
            return any([writer.end_episode() for writer in writers])

    def flush(self) -> None:
        """Make everything added so far durable; readers opened afterwards (or refreshed) see it."""
        with self._mutex:
            self._writable("flush")
            for writer in self._writers:
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
        with self._mutex:
            writer = self._only_writer("load steps") if stream is None else self._writable_stream(stream)
            writer.load_steps(scalars, frame_blocks, str(self.path))
            self._priorities = Priorities(self.rings)
            self._samplers.clear()  # (prioritized ones hold the old priorities)

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
        with self._mutex:
            self._check_open()
            moved = []
            for k in range(self.num_streams):
                if k in self._by_stream:
                    continue
                first = self._view.refresh(k)
                if first is not None:
                    self._priorities.adopt(k, first)
                    moved.append(k)
            return moved

    # ---------------------------------------------------------------------------------------------
    # Sampling

    def sample(self, batch_size: int, *, rng: np.random.Generator | None = None, n_step: int = 1,
               gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
               sampler: Sampler | None = None) -> Batch:
        """Sample ``batch_size`` transitions with replacement: uniformly, or by priority.

        ``n_step`` > 1 returns the discounted n-step reward, the observation up to ``n_step`` moves
        ahead and ``discount = gamma**k`` (0 after a termination). With ``prioritized=True`` a
        transition is drawn with probability ``p**alpha / sum p**alpha`` and ``weight`` holds its
        importance weight ``(N P(i))**-beta``, normalised so the largest possible weight is 1; set
        priorities with ``update_priorities(batch.index, new_priorities)``. ``sampler``: a sampler
        made elsewhere in place of those arguments, such as a ``HindsightSampler`` (its batch type).
        Safe to call from several threads and alongside ``add`` (decoding runs outside the store's lock).

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").sample(4, rng=np.random.default_rng(1), n_step=3).discount.shape
            (4,)
        """
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta)
        batch: Batch = self._viewed(self.plan(sampler, check_batch_size(batch_size), rng=rng).finish(self.reader))
        return batch

    def sample_sequences(self, batch_size: int, length: int, *, rng: np.random.Generator | None = None) -> SequenceBatch:
        """Sample ``batch_size`` windows of ``length`` consecutive transitions, each inside one episode
        of one stream, uniformly (with replacement) over every valid window start: for recurrent
        agents and world models. ``obs`` is ``(batch, length + 1, frame_stack, *obs_shape)`` (the
        window's observations and the one after its last move), ``action``, ``reward``,
        ``terminated`` and ``truncated`` are ``(batch, length)``, ``index`` the slot of each window's
        first step. Episodes shorter than ``length`` moves are never drawn; a store with no window
        raises ``SampleError``. A draw costs what the window costs, not what the store holds.

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").sample_sequences(4, 3, rng=np.random.default_rng(0)).obs.shape
            (4, 4, 2, 4)
        """
        batch: SequenceBatch = self._viewed(self.plan(SequenceSampler(length), check_batch_size(batch_size),
                                                      rng=rng).finish(self.reader))
        return batch

    def episode(self, index: int = -1, *, stream: int = 0, moves: slice | None = None) -> Episode:
        """Live episode ``index`` of ``stream``, oldest first (negative: from the newest; -1, the
        default, is the newest, which may be in progress), read whole: every observation (single
        frames, ``(moves + 1, *obs_shape)``), action, reward and how each move ended, and whether
        it ``ended`` terminated, truncated or is in progress (sampling/episodes.py). ``moves``
        (a slice, such as ``slice(0, 1000)``) reads those of its live moves and the observations
        around them instead. A stream or index the store does not have raises ``SampleError``, and
        so do frames that would take more than half of ``memory_budget`` (or of the memory this
        process may use): read such an episode in parts.

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").episode(0).obs.shape[1:]
            (4,)
        """
        with self._mutex:
            self._check_open()
            pending = plan_episode(self.rings, self.reader, index, stream, moves=moves, budget=self._memory_budget)
        episode: Episode = self._viewed(pending.finish(self.reader))
        return episode

    def iter_episodes(self, *, stream: int | None = None, whole: bool = False) -> Iterator[Episode]:
        """Every live episode of ``stream`` (None: of each stream in turn), oldest first, each read
        whole as ``episode`` reads it, one at a time; with ``whole``, only those whose first and
        last steps are both live and that hold a move (no episode in progress, none the ring has cut).
        Each stream's episodes are listed once, when the iteration reaches it: an episode the writer
        overwrites before it is read raises ``SampleError``, and so does one too large to read at
        once (``episode``).

        Example:
            >>> sum(len(e) for e in ReplayStore.open("/tmp/doc.zarr").iter_episodes()) > 0
            True
        """
        with self._mutex:
            self._check_open()
            if stream is not None:
                stream_ring(self.rings, stream)  # a stream the store does not have: SampleError here
            streams = range(self.num_streams) if stream is None else [int(stream)]
        return self._episodes_of(streams, whole)

    def _episodes_of(self, streams: Iterable[int], whole: bool) -> Iterator[Episode]:
        for k in streams:
            with self._mutex:
                self._check_open()
                table = episode_table(stream_ring(self.rings, k))
            for i in range(int(table["start_step"].size)):
                if whole and not (table["whole"][i] and table["lengths"][i]):
                    continue
                with self._mutex:
                    self._check_open()
                    pending = plan_span(stream_ring(self.rings, k), self.reader, k, i, table,
                                        budget=self._memory_budget)
                episode: Episode = self._viewed(pending.finish(self.reader))
                yield episode

    def sampler(self, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6,
                beta: float = 0.4, sequence_length: int | None = None) -> Sampler:
        """The sampler these arguments describe (sampling/samplers.py), checked: transitions drawn
        uniformly or by priority (this store's priorities), or windows of ``sequence_length``. Made
        once per set of arguments (``sample`` asks for one per call)."""
        key = (type(n_step), n_step, type(gamma), gamma, prioritized, alpha, beta, sequence_length)  # (True != 1)
        try:
            return self._samplers[key]
        except (KeyError, TypeError):  # (TypeError: unhashable arguments, refused below)
            pass
        sampler: Sampler
        if sequence_length is not None:
            sampler = SequenceSampler(sequence_length)
        elif prioritized:
            sampler = PrioritizedSampler(self._priorities, alpha=alpha, beta=beta, n_step=n_step, gamma=gamma)
        else:
            sampler = UniformSampler(n_step=n_step, gamma=gamma)
        if len(self._samplers) < 64:
            self._samplers[key] = sampler
        return sampler

    def _chosen(self, sampler: Sampler | None, **arguments: Any) -> Sampler:
        """``sampler`` bound to this store, or (None) the one ``arguments`` describe."""
        if sampler is None:
            return self.sampler(**arguments)
        if not isinstance(sampler, Sampler):
            raise ConfigError(f"sampler is {sampler!r}; pass a replaystore sampler (such as HindsightSampler) or None")
        given = [name for name, value in arguments.items() if value != _SAMPLER_DEFAULTS[name]]
        if given:
            raise ConfigError(f"sampler= was passed together with {', '.join(given)}, which describe another sampler; "
                              f"give the sampler its own settings (it samples as {sampler.describe()})")
        return sampler.bind(self.schema)

    def plan(self, sampler: Sampler, batch_size: int, *, rng: np.random.Generator | None = None, batches: int = 1,
             out: list[np.ndarray] | None = None) -> Pending:
        """The locked half of sampling, for callers that decode the frames elsewhere (the
        prefetcher): ``sampler`` draws ``batches`` batches and plans them (``Sampler.plan``). The
        returned ``Pending`` is finished with ``pending.finish(store.reader)`` without the lock."""
        rng = rng if rng is not None else np.random.default_rng()
        with self._mutex:
            self._check_open()
            return sampler.plan(self.rings, self.reader, batch_size, rng, batches=batches, out=out)

    def blocks(self, batch_size: int, *, batches_per_block: int = 8, n_step: int = 1, gamma: float = 0.99,
               prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, threads: int = 2, depth: int = 4,
               seed: int | None = None, processes: bool | None = None, sequence_length: int | None = None,
               sampler: Sampler | None = None) -> Any:
        """An endless iterator of sampled *blocks*, drawn in the background: each a ``feed.blocks.Block``
        (a mapping of numpy arrays with the ``Batch`` fields, or with ``sequence_length`` the
        ``SequenceBatch`` fields) shaped ``(batches_per_block, batch_size, ...)``: row ``i`` is batch
        ``i``. For any learner, whatever its framework: one that runs ``batches_per_block`` gradient
        steps per compiled call takes a block at a time. ``threads``, ``depth`` (blocks in flight),
        ``seed`` and ``processes`` are as for ``as_dataset``; the same seed gives the same blocks as
        ``as_dataset(..., batches_per_call=batches_per_block)`` cuts into batches. ``sampler``: a
        sampler made elsewhere (a ``HindsightSampler``) in place of the sampling arguments.

        ``block.release()`` (or ``with block:``) hands a block's memory back for the next one; a
        released block's fields raise ``BlockReleasedError``, and an array taken from it keeps its
        values for as long as it is held (its memory is reused only once nothing refers to it).
        Returns a ``feed.blocks.BlockIterator``; ``close()`` (or ``with``) stops its workers.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr").blocks(8, batches_per_block=4, seed=0) as it:  # doctest: +SKIP
            ...     next(it)["obs"].shape
            (4, 8, 2, 4)
        """
        from replaystore.feed.blocks import BlockIterator

        self._check_open()
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta,
                               sequence_length=sequence_length)
        return BlockIterator(self, sampler, batch_size, batches_per_block=batches_per_block, threads=threads,
                             depth=depth, seed=seed, processes=processes)

    def as_dataset(self, batch_size: int, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False,
                   alpha: float = 0.6, beta: float = 0.4, prefetch: int = 4, threads: int = 2,
                   batches_per_call: int = 8, seed: int | None = None, device: str | None = "auto",
                   processes: bool | None = None, blocks: bool = False, sequence_length: int | None = None,
                   sampler: Sampler | None = None) -> Any:
        """An endless ``tf.data.Dataset`` of sampled batches, drawn in the background (imports TensorFlow).

        Each element is a dict with the ``Batch`` fields (with ``sequence_length``, the
        ``SequenceBatch`` fields; with ``blocks=True``, whole blocks of ``batches_per_call``
        batches) and a fixed ``element_spec``. ``threads`` workers draw ``batches_per_call`` batches
        per call ahead of the consumer, ``prefetch`` batches are kept ready; ``processes`` (None:
        where possible, unless the store keeps its small frames decoded) decodes in child processes
        instead of on the threads, with the same batches.
        ``device="auto"`` places batches on the first GPU when there is one. With a ``seed`` and a
        store that is not being written, the batches are the same every run; it works while this
        process ``add``s to the store. ``sampler``: as for ``blocks``. RAM and speed of each knob:
        docs/sampling.md.

        Returns a ``tfdata.ReplayDataset``, a ``tf.data.Dataset`` whose ``prefetcher`` owns the
        workers (``dataset.prefetcher.close()`` stops them; so does the end of this process).

        Example:
            >>> ds = ReplayStore.open("/tmp/doc.zarr").as_dataset(8, seed=0)  # doctest: +SKIP
            >>> next(iter(ds))["obs"].shape  # doctest: +SKIP
            TensorShape([8, 2, 4])
        """
        from replaystore.feed.tfdata import as_dataset

        self._check_open()
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta,
                               sequence_length=sequence_length)
        return as_dataset(self, sampler, batch_size, prefetch=prefetch, threads=threads,
                          batches_per_call=batches_per_call, seed=seed, device=device, processes=processes,
                          blocks=blocks)

    def jax_blocks(self, batch_size: int, *, batches_per_block: int = 32, device: Any = None, depth: int = 2,
                   **kwargs: Any) -> Any:
        """``blocks`` already on a JAX device: a feeder thread puts each block on ``device`` (default:
        JAX's first device, a GPU where there is one) with ``jax.device_put`` while the learner
        trains on the one before, ``depth`` blocks ahead. Each item is a dict of ``jax.Array``
        shaped ``(batches_per_block, batch_size, ...)``, ready for a compiled call that runs a
        block's gradient steps (``lax.scan``); ``index`` stays a numpy array (it is for
        ``update_priorities``). Host memory is not reused before its copy is done.
        Other arguments as for ``blocks``. Returns a ``feed.jaxfeed.DeviceBlocks``; ``close()`` (or
        ``with``) stops it. Needs JAX (``pip install 'replaystore[jax]'``).
        """
        from replaystore.feed.jaxfeed import DeviceBlocks

        self._check_open()
        names = ("n_step", "gamma", "prioritized", "alpha", "beta", "sequence_length")
        sampler = self._chosen(kwargs.pop("sampler", None), **{name: kwargs.pop(name) for name in names if name in kwargs})
        return DeviceBlocks(self, sampler, batch_size, device=device, depth=depth, batches_per_block=batches_per_block,
                            **kwargs)

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (``batch.index``) to ``priority``.

        Priorities must be finite and >= 0 (typically ``|td_error| + eps``); they are clipped below to
        1e-6 so no transition is starved. A writer saves them with its next flush, so a reopened store
        samples with them; a read-only store keeps them in RAM only.
        """
        idx, prio = check_priorities(index, priority, self.rings.size)
        if idx.size == 0:
            return
        with self._mutex:
            self._check_open()
            self._priorities.update(idx, prio)

    def priorities(self, index: Any) -> np.ndarray:
        """The current priorities (before ``alpha``) of the slots in ``index``, as float32."""
        idx = check_slots(index, self.rings.size)
        with self._mutex:
            return self.rings.priority[idx].copy()

    def warm_cache(self) -> int:
        """Read the store's compressed frame chunks into the cache now, shard by shard (up to
        ``cache_bytes``), so sampling never waits on a disk read; returns the bytes loaded. A 1M-frame
        Atari store is ~65 MB and loads in about a second."""
        with self._mutex:
            self._check_open()
            return self.reader.warm(range(-(-self.rings.size // self.layout.shard_len)))

    def memory_estimate(self) -> dict[str, int]:
        """Bytes of RAM each part of this store can use, its live prefetchers' (``as_dataset``) blocks
        and decode processes included (sampling/memory.py); ``sum(...values())`` for the total."""
        parts = estimate(self.schema, self.layout, writable=len(self.writing),
                         cache_bytes=self.reader.cache_bytes, decode_threads=self.reader.decode_threads)
        for prefetcher in list(self._prefetchers):
            for name, nbytes in prefetcher.memory.items():
                parts[name] = parts.get(name, 0) + nbytes
        return parts

    def admit_prefetcher(self, prefetcher: Any) -> None:
        """Count a new prefetcher's RAM (``prefetcher.memory``) as this store's: refused with
        ``ConfigError`` when the total would exceed the store's memory budget (or the memory this
        process may use), before the prefetcher starts anything."""
        parts = self.memory_estimate()
        for name, nbytes in prefetcher.memory.items():
            parts[name] = parts.get(name, 0) + nbytes
        check_budget(parts, self._memory_budget, path=str(self.path), adding=prefetcher.memory)
        self._prefetchers.add(prefetcher)

    # ---------------------------------------------------------------------------------------------
    # What it holds

    def __len__(self) -> int:
        """Transitions that ``sample`` can return, over every stream (at most ``capacity``)."""
        return self.rings.n_valid

    @property
    def ring(self) -> Ring:
        """The ring of a one-stream store (a store of streams has ``rings.streams[k]``)."""
        if self.schema.num_streams != 1:
            raise ConfigError(f"{self.path} holds {self.schema.num_streams} streams; use store.rings.streams[k]")
        return self.rings.streams[0]

    @property
    def num_streams(self) -> int:
        return self.schema.num_streams

    @property
    def writers(self) -> list[StreamWriter]:
        """The writer of each stream written here (storage/stream.py), in ``writing`` order."""
        return list(self._writers)

    @property
    def committed(self) -> State:
        """The state last committed to storage (what a reader opened now would see). For a store of
        streams: ``added`` and ``episodes`` summed over them (each one's: ``stream_states()``)."""
        states = self.stream_states()
        if len(states) == 1:
            return states[0]
        return State(added=sum(s.added for s in states), oldest=0,
                     episode_in_progress=any(s.episode_in_progress for s in states),
                     episodes=sum(s.episodes for s in states), updated=max(s.updated for s in states))

    def stream_states(self) -> list[State]:
        """Each stream's committed state, as this store knows it (``refresh`` reads others' anew)."""
        return [self._by_stream[k].committed if k in self._by_stream else self._view.states[k]
                for k in range(self.num_streams)]

    @property
    def capacity(self) -> int:
        return self.schema.capacity

    @property
    def frame_stack(self) -> int:
        return self.schema.frame_stack

    @property
    def added(self) -> int:
        """Steps ever written, over every stream (flushed or not)."""
        return self.rings.added

    @property
    def episodes(self) -> int:
        """Episodes ever started in this store (as committed, or as written by this writer)."""
        return sum(self._by_stream[k].episodes if k in self._by_stream else state.episodes
                   for k, state in enumerate(self._view.states))

    @property
    def episode_in_progress(self) -> bool:
        """True when the last step added awaits its move (the next ``add`` must continue from it);
        for several streams, that of the one ``add`` writes (or of any, read-only)."""
        if len(self._writers) == 1:
            return self._writers[0].episode_in_progress()
        return any(ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])
                   for ring in self.rings.streams)

    @property
    def observation_space(self) -> Any:
        """The observations' gymnasium space: a ``Box``, or a ``Dict`` of them."""
        return self.schema.observation_space()

    @property
    def action_space(self) -> Any:
        return self.schema.action.to_space()

    @property
    def cache_hit_rate(self) -> float:
        """Fraction of stored chunk lookups served from the compressed-chunk cache."""
        return self.reader.hit_rate

    @property
    def cache_bytes_held(self) -> int:
        """Compressed chunk bytes held in RAM by the cache (at most ``cache_bytes``)."""
        return self.reader.bytes_held

    def __repr__(self) -> str:
        streams = f", streams={self.num_streams}" if self.num_streams > 1 else ""
        return (f"ReplayStore({str(self.path)!r}, mode={self.mode!r}, transitions={len(self)}, "
                f"capacity={self.capacity}{streams})")

    # ---------------------------------------------------------------------------------------------

    def _viewed(self, result: Any) -> Any:
        """A batch, sequence batch or episode with its frames as the store gives them (a Dict
        store's as dicts of arrays)."""
        if self.schema.observation_dict is None:
            return result
        names = [name for name in ("obs", "next_obs") if hasattr(result, name)]
        return dataclasses.replace(result, **{name: self.schema.obs_view(getattr(result, name)) for name in names})

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path} was closed; open it again with ReplayStore.open")

    def _writable(self, what: str) -> None:
        self._check_open()
        if not self._writers:
            raise ReadOnlyError(f"cannot {what}: {self.path} is open read-only; open it with mode='a' to append")

    def _writable_stream(self, k: int) -> StreamWriter:
        self._writable("write")
        if k not in self._by_stream:
            raise ConfigError(f"stream {k} of {self.path} is not open for writing here; it writes {self.writing}")
        return self._by_stream[k]

    def _only_writer(self, what: str) -> StreamWriter:
        """The one stream ``add`` writes (raises unless exactly one is open for writing)."""
        self._writable(what)
        if len(self._writers) > 1:
            raise ConfigError(
                f"cannot {what}: {self.path} is open for writing {len(self.writing)} streams ({self.writing}); use "
                "add_batch with one row per stream, or open one stream: ReplayStore.open(path, mode='a', streams=[k])")
        return self._writers[0]


def _release(writers: tuple[StreamWriter, ...], reader: FrameReader, backend: Backend, path: str) -> None:
    """Close a store's parts: what ``close`` does, and what a store dropped without ``close`` gets
    when it is garbage-collected (a writer's last steps are flushed, like a file's buffer)."""
    try:
        for writer in writers:
            try:
                writer.flush()
            except Exception as exc:  # noqa: BLE001 - a finalizer cannot raise; say what was lost
                log.warning("replay store %s was dropped without close() and its last flush failed (%s); it "
                            "reopens at its last commit", path, exc)
    finally:
        reader.close()
        backend.close()
