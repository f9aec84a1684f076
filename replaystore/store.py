"""ReplayStore: the public face. Wiring only: it validates, then hands work to its parts.

    ring      storage/ring.py       per-step scalars in RAM, the live range, the sampleable bitmap
    writer    storage/writer.py     the frame shard buffer, whole-shard writes, the commit
    reader    storage/reader.py     chunk-aware frame reads with a compressed-chunk cache
    lock      storage/lock.py       one writer per store (per stream)
    commits   storage/commits.py    the committed states on disk, the streams a handle writes
    Sampling  sampling/methods.py   the reading half of this class: sample, priorities, as_dataset
    sampler   sampling/sampler.py   which positions a batch uses (uniform, or prioritized)
    memory    sampling/memory.py    the RAM estimate and budget check

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

import logging
import numbers
import threading
import weakref
from pathlib import Path
from typing import Any, Self

from replaystore.errors import (
    ConfigError,
    StoreClosedError,
)
from replaystore.format.schema import (
    MAX_CAPACITY,
    MAX_STREAMS,
    Layout,
    Schema,
    State,
    box_from_space,
    default_layout,
    discrete_from_space,
    stream_stride,
)
from replaystore.format.validate import (
    validate_layout,
)
from replaystore.sampling.memory import check_config
from replaystore.sampling.methods import Sampling
from replaystore.sampling.priority import Priorities
from replaystore.storage import localopen, objectopen
from replaystore.storage.commits import read_stream_state, root_state
from replaystore.storage.lock import WriterLock
from replaystore.storage.objects import is_url, local_path
from replaystore.storage.objectstreams import ObjectStreams
from replaystore.storage.objectwriter import ObjectWriter
from replaystore.storage.reader import FrameReader
from replaystore.storage.refresh import refresh_streams
from replaystore.storage.ring import Ring
from replaystore.storage.rings import Rings
from replaystore.storage.stream import Stream
from replaystore.storage.writer import Writer, load_scalars
from replaystore.storage.writing import Writing

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 256 * 2**20


class ReplayStore(Writing, Sampling):
    """A disk-backed replay buffer of steps in a zarr v3 group, in one or more episode streams.

    Use ``ReplayStore.create`` or ``ReplayStore.open``; see the module docstring for an example.
    """

    def __init__(self, root: Path, schema: Schema, layout: Layout, states: list[State], group_doc: dict[str, Any], *,
                 writing: list[int], cache_bytes: int, locks: list[Any], decode_threads: int = 1,
                 memory_budget: int | None = None, objects: ObjectStreams | None = None) -> None:
        self.path = root
        self.objects = objects  # a store on object storage: its commits and leases (storage/objectstreams.py)
        self.schema = schema
        self.layout = layout
        self.mode = "a" if writing else "r"
        self._locks = locks
        self._closed = False
        self._memory_budget = memory_budget
        self._prefetchers: weakref.WeakSet[Any] = weakref.WeakSet()  # live ones: their RAM is the store's too
        # Guards the rings, the writers and the reader's caches: ``add``/``flush`` and the planning half of
        # ``sample`` hold it; decoding frames does not (see reader.py), so samplers on other threads
        # (``as_dataset``) and the acting thread's ``add`` mostly run side by side.
        self._mutex = threading.RLock()
        n = schema.num_streams
        stride = stream_stride(schema, layout)
        self.rings = Rings(n, schema.stream_capacity, stride, schema.frame_stack, layout.shard_len)
        self.reader = FrameReader(root, schema, layout, cache_bytes=cache_bytes, decode_threads=decode_threads,
                                  slots_of=self.rings.slots if n > 1 else None,
                                  bucket=objects.bucket if objects is not None else None)
        self.streams = [Stream(k, self.rings.streams[k], states[k], base_shard=k * stride // layout.shard_len)
                        for k in range(n)]
        for stream in self.streams:
            stream.ring.added, stream.ring.oldest = stream.committed.added, stream.committed.oldest
            self._load_scalars(stream.index)
            stream.ring.rebuild_valid()
        self._priorities = Priorities(self.rings)
        self.writing = sorted(writing)  # the streams this store writes, in the order add_batch takes them
        self._writers: list[Writer] = []
        for k in self.writing:
            stream = self.streams[k]
            if objects is not None:
                stream.writer = ObjectWriter(objects, schema, layout, stream.ring, self.reader, stream.committed,
                                             stream=k, base_shard=stream.base_shard)
            else:
                stream.writer = Writer(root, schema, layout, stream.ring, self.reader, group_doc if n == 1 else {},
                                       stream.committed, stream=k, base_shard=stream.base_shard)
            self._writers.append(stream.writer)
        self._writer = self._writers[0] if len(self._writers) == 1 else None
        if self._writers:
            writers = tuple(self._writers)
            self.reader.live_regions = lambda: [r for w in writers if (r := w.live_region()) is not None]
        if len(self.writing) < n:
            self.reader.snapshot()  # read the files of this commit even while other writers move on
        # Closes what this store holds if it is dropped without close(). It refers to the parts only,
        # never to the store, so it does not keep the store alive (and the parts do not refer to it).
        self._finalizer = weakref.finalize(self, _release, tuple(self._writers), self.reader, tuple(locks), str(root))
        if objects is not None and self._writers:
            objects.keep(self._mutex)  # renews the leases while the writer is idle
        for k in self.writing:
            stream = self.streams[k]
            if stream.episode_in_progress():
                stream.head_obs = stream.writer.frame_at(stream.ring.added - 1)
            elif stream.ring.added:  # a vector env that goes on after an episode end sends its reset row next
                stream.reset_next, stream.reset_optional = stream.writer.frame_at(stream.ring.added - 1), True

    # ---------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def create(cls, path: str | Path, capacity: int, observation_space: Any, action_space: Any, frame_stack: int = 1, *,
               layout: Layout | None = None, overwrite: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES,
               memory_budget: int | None = None, decode_threads: int = 1, num_streams: int = 1,
               storage_options: dict[str, Any] | None = None) -> ReplayStore:
        """Create a store for ``capacity`` steps and open it for appending.

        ``num_streams`` > 1 makes a store of that many episode streams (one per environment of a
        vector env; see ``add_batch``), each a ring of ``capacity / num_streams`` steps. RAM: see
        ``memory_estimate``; with ``memory_budget`` (bytes) a configuration whose estimate
        exceeds it is refused before anything is written. ``decode_threads`` > 1 decodes each batch's
        chunks on that many threads.

        ``path`` may be a URL, ``s3://bucket/prefix/replay.zarr`` (any S3-compatible server: the
        endpoint and credentials come from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... or from
        ``storage_options``, which also takes ``lease_ttl`` and ``gc_grace`` in seconds; see
        docs/objects.md).

        Example:
            >>> store = ReplayStore.create("/tmp/doc2.zarr", 4096, gym.spaces.Box(0, 255, (84, 84), np.uint8),
            ...                            gym.spaces.Discrete(4), frame_stack=4, overwrite=True)  # doctest: +SKIP
        """
        url = path if is_url(path) else None
        root = Path(local_path(path)) if url is None else Path()
        box = box_from_space(observation_space)
        discrete = discrete_from_space(action_space)
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or not 2 <= capacity <= MAX_CAPACITY:
            raise ConfigError(f"capacity is {capacity!r}; it must be an int between 2 and {MAX_CAPACITY} steps")
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, numbers.Integral) or not 1 <= frame_stack <= 1024:
            raise ConfigError(f"frame_stack is {frame_stack!r}; it must be an int between 1 and 1024 (4 for Atari)")
        if (isinstance(num_streams, bool) or not isinstance(num_streams, numbers.Integral)
                or not 1 <= num_streams <= MAX_STREAMS):
            raise ConfigError(f"num_streams is {num_streams!r}; it must be an int between 1 and {MAX_STREAMS} "
                              "(one per environment that writes)")
        n = int(num_streams)
        if capacity % n:
            lower, upper = capacity - capacity % n, capacity - capacity % n + n
            raise ConfigError(f"capacity {capacity} does not split evenly into {n} streams; use a multiple of {n} "
                              f"such as {lower} or {upper}")
        stream_capacity = int(capacity) // n
        layout = layout or default_layout(box.frame_bytes, stream_capacity)
        validate_layout(layout, stream_capacity)
        schema = Schema(box, discrete, int(capacity), int(frame_stack), n)
        check_config(schema, layout, url or root, writable=n, cache_bytes=cache_bytes,  # type: ignore[arg-type]
                     memory_budget=memory_budget, decode_threads=decode_threads)
        if url is not None:
            return objectopen.create(cls, url, schema, layout, overwrite=overwrite, cache_bytes=cache_bytes,
                                     memory_budget=memory_budget, decode_threads=decode_threads,
                                     storage_options=storage_options)

        return localopen.create(cls, root, schema, layout, overwrite=overwrite, cache_bytes=cache_bytes,
                                memory_budget=memory_budget, decode_threads=decode_threads)

    @classmethod
    def open(cls, path: str | Path, mode: str = "r", *, streams: Any = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
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
        if is_url(path):
            return objectopen.open_(cls, path, mode, streams=streams, cache_bytes=cache_bytes,  # type: ignore[arg-type]
                                    memory_budget=memory_budget, decode_threads=decode_threads,
                                    storage_options=storage_options)
        return localopen.open_(cls, Path(local_path(path)), mode, streams=streams, cache_bytes=cache_bytes,
                               memory_budget=memory_budget, decode_threads=decode_threads)

    def _read_state(self, k: int) -> State:
        """Stream ``k``'s latest commit on disk."""
        if self.objects is not None:
            return self.objects.read_state(k)
        return read_stream_state(self.path, k) if self.schema.num_streams > 1 else root_state(self.path)

    def _load_scalars(self, k: int, shards: Any = None, check: bool = True) -> None:
        """Read stream ``k``'s scalar shards (default: all) as of the commit last read into its ring."""
        stream = self.streams[k]
        if self.objects is None:
            load_scalars(self.path, self.layout, stream.ring, base_shard=stream.base_shard, shards=shards, check=check)
            return
        files, reader = self.reader.files, self.reader

        def point(shard: int, key: str | None) -> None:
            if files.keys.get(shard, None) != key or shard not in files.keys:  # type: ignore[attr-defined]
                files.set_key(shard, key)  # type: ignore[attr-defined]
                reader.invalidate(shard)

        self.objects.load_scalars(k, stream.ring, shards, point, check=check)

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
            return refresh_streams(self)

    def close(self) -> None:
        """Flush (when writing), release the writer locks and free file handles. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            try:
                for writer in self._writers:
                    writer.flush()
            finally:
                self._closed = True
                self._finalizer.detach()
                _release((), self.reader, tuple(self._locks), str(self.path))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # Reading

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
    def committed(self) -> State:
        """The state last committed to disk (what a reader opened now would see). For a store of
        streams: ``added`` and ``episodes`` summed over them (each one's: ``stream_states()``)."""
        states = self.stream_states()
        if len(states) == 1:
            return states[0]
        return State(added=sum(s.added for s in states), oldest=0,
                     episode_in_progress=any(s.episode_in_progress for s in states),
                     episodes=sum(s.episodes for s in states), updated=max(s.updated for s in states))

    def stream_states(self) -> list[State]:
        """Each stream's committed state, as this store knows it (``refresh`` reads others' anew)."""
        return [s.writer.committed if s.writer is not None else s.committed for s in self.streams]

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
        return sum(s.writer.episodes if s.writer is not None else s.committed.episodes for s in self.streams)

    @property
    def episode_in_progress(self) -> bool:
        """True when the last step added awaits its move (the next ``add`` must continue from it);
        for several streams, that of the one ``add`` writes (or of any, read-only)."""
        if len(self.writing) == 1:
            return self.streams[self.writing[0]].episode_in_progress()
        return any(s.episode_in_progress() for s in self.streams)

    @property
    def observation_space(self) -> Any:
        return self.schema.observation.to_space()

    @property
    def action_space(self) -> Any:
        return self.schema.action.to_space()

    def __repr__(self) -> str:
        streams = f", streams={self.num_streams}" if self.num_streams > 1 else ""
        return (f"ReplayStore({str(self.path)!r}, mode={self.mode!r}, transitions={len(self)}, "
                f"capacity={self.capacity}{streams})")

    # ---------------------------------------------------------------------------------------------
    # Validation

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path} was closed; open it again with ReplayStore.open")


def _release(writers: tuple[Writer, ...], reader: FrameReader, locks: tuple[WriterLock, ...], path: str) -> None:
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
        for lock in locks:
            lock.release()
