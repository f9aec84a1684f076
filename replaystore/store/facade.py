"""``ReplayStore``, the public face: making and opening a store (wiring its parts) and what it holds.
It holds its parts (parts.py's ``Parts``) and its two halves, each over those parts: reading.py's
``Reading`` (sampling, episodes, feeds, their memory) and writing.py's ``Writing`` (adding moves,
commits, following other writers), whose methods it gives as its own (``delegated``). The package's
docstring (store/__init__.py) lists the parts they hand the work to."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from replaystore.errors import ConfigError
from replaystore.format.schema import (
    Layout,
    State,
)
from replaystore.format.validate import (
    check_streams,
    new_schema,
)
from replaystore.sampling.memory import DEFAULT_CACHE_BYTES, check_config, default_cache_bytes
from replaystore.sampling.priority import Priorities
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.stream import StreamWriter
from replaystore.store.parts import Parts, delegated
from replaystore.store.reading import Reading
from replaystore.store.writing import Writing

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_CACHE_BYTES", "ReplayStore"]



class ReplayStore:
    """A disk-backed replay buffer of steps in a zarr v3 group, in one or more episode streams.

    Use ``ReplayStore.create`` or ``ReplayStore.open``; see the module docstring for an example.
    """

    def __init__(self, backend: Backend, *, writing: list[int], cache_bytes: int, decode_threads: int = 1,
                 memory_budget: int | None = None) -> None:
        """Assemble a store over ``backend``, whose metadata is read and whose ``writing`` streams this
        process has claimed (``create`` and ``open`` do that)."""
        parts = Parts(backend, writing=writing, cache_bytes=cache_bytes, decode_threads=decode_threads,
                      memory_budget=memory_budget)
        self._parts = parts
        self.backend, self.path, self.schema, self.layout = backend, parts.path, parts.schema, parts.layout
        self.rings, self.reader = parts.rings, parts.reader
        self.writing = parts.writing  # the streams this store writes, in the order add_batch takes them
        self.mode = "a" if writing else "r"
        self._reading = Reading(parts)
        self._writing = Writing(parts)
        # Closes what this store holds if it is dropped without close(): when its parts are left to no one
        # (the store, and any feed drawing from its reading half). It refers to what it closes only.
        self._finalizer = weakref.finalize(parts, _release, tuple(parts.writers), self.reader, backend, str(self.path))

    # What it reads and writes: each method is its part's (reading.py, writing.py; parts.py's ``delegated``)
    sample = delegated("_reading", Reading.sample)
    sample_sequences = delegated("_reading", Reading.sample_sequences)
    episode = delegated("_reading", Reading.episode)
    iter_episodes = delegated("_reading", Reading.iter_episodes)
    sampler = delegated("_reading", Reading.sampler)
    plan = delegated("_reading", Reading.plan)
    blocks = delegated("_reading", Reading.blocks)
    as_dataset = delegated("_reading", Reading.as_dataset)
    jax_blocks = delegated("_reading", Reading.jax_blocks)
    torch_blocks = delegated("_reading", Reading.torch_blocks)
    update_priorities = delegated("_reading", Reading.update_priorities)
    priorities = delegated("_reading", Reading.priorities)
    warm_cache = delegated("_reading", Reading.warm_cache)
    memory_estimate = delegated("_reading", Reading.memory_estimate)
    admit_prefetcher = delegated("_reading", Reading.admit_prefetcher)
    add = delegated("_writing", Writing.add)
    add_batch = delegated("_writing", Writing.add_batch)
    end_episode = delegated("_writing", Writing.end_episode)
    flush = delegated("_writing", Writing.flush)
    load_steps = delegated("_writing", Writing.load_steps)
    refresh = delegated("_writing", Writing.refresh)

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
        parts = self._parts
        with parts.mutex:
            if parts.closed:
                return
            try:
                for writer in parts.writers:
                    writer.flush()
            finally:
                parts.closed = True
                self._finalizer.detach()
                _release((), self.reader, self.backend, str(self.path))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # What it holds

    def __len__(self) -> int:
        """Transitions that ``sample`` can return, over every stream (at most ``capacity``)."""
        return self.rings.n_valid

    @property
    def num_streams(self) -> int:
        return self.schema.num_streams

    @property
    def _priorities(self) -> Priorities:
        """The prioritized samplers' state (tests read its tree)."""
        return self._parts.priorities

    @property
    def ring(self) -> Ring:
        """The ring of a one-stream store (a store of streams has ``rings.streams[k]``)."""
        if self.schema.num_streams != 1:
            raise ConfigError(f"{self.path} holds {self.schema.num_streams} streams; use store.rings.streams[k]")
        return self.rings.streams[0]

    @property
    def writers(self) -> list[StreamWriter]:
        """The writer of each stream written here (storage/stream.py), in ``writing`` order."""
        return list(self._parts.writers)

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
        parts = self._parts
        return [parts.by_stream[k].committed if k in parts.by_stream else parts.view.states[k]
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
        parts = self._parts
        return sum(parts.by_stream[k].episodes if k in parts.by_stream else state.episodes
                   for k, state in enumerate(parts.view.states))

    @property
    def episode_in_progress(self) -> bool:
        """True when the last step added awaits its move (the next ``add`` must continue from it);
        for several streams, that of the one ``add`` writes (or of any, read-only)."""
        if len(self._parts.writers) == 1:
            return self._parts.writers[0].episode_in_progress()
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
