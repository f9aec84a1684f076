"""ReplayStore: the public face. Wiring only: it validates, then hands work to its parts.

    ring      storage/ring.py       per-step scalars in RAM, the live range, the sampleable bitmap
    writer    storage/writer.py     the frame shard buffer, whole-shard writes, the commit
    reader    storage/reader.py     chunk-aware frame reads with a compressed-chunk cache
    lock      storage/lock.py       one writer per store
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

import dataclasses
import logging
import numbers
import threading
import weakref
from pathlib import Path
from typing import Any, Self

import numpy as np

from replaystore.errors import (
    ConfigError,
    CorruptStoreError,
    ReadOnlyError,
    StoreClosedError,
    StoreLockedError,
)
from replaystore.format.schema import (
    ATTR_KEY,
    MAX_CAPACITY,
    SCALAR_FIELDS,
    Layout,
    Schema,
    State,
    box_from_space,
    default_layout,
    discrete_from_space,
    from_attrs,
    to_attrs,
)
from replaystore.format.shards import create_array_metadata, remove_partials
from replaystore.format.validate import (
    check_arrays,
    read_group_doc,
    validate_layout,
)
from replaystore.sampling.memory import check_config
from replaystore.sampling.methods import Sampling
from replaystore.sampling.priority import Priorities
from replaystore.storage.lock import WriterLock, claim_directory
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.writer import Writer, load_scalars, write_group_json
from replaystore.storage.writing import Writing

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 256 * 2**20


class ReplayStore(Writing, Sampling):
    """A disk-backed replay buffer of steps in a zarr v3 group.

    Use ``ReplayStore.create`` or ``ReplayStore.open``; see the module docstring for an example.
    """

    def __init__(self, root: Path, schema: Schema, layout: Layout, state: State, group_doc: dict[str, Any], *,
                 writable: bool, cache_bytes: int, lock: WriterLock | None, decode_threads: int = 1,
                 memory_budget: int | None = None) -> None:
        self.path = root
        self.schema = schema
        self.layout = layout
        self.mode = "a" if writable else "r"
        self._lock = lock
        self._closed = False
        self._memory_budget = memory_budget
        self._prefetchers: weakref.WeakSet[Any] = weakref.WeakSet()  # live ones: their RAM is the store's too
        # Guards the ring, the writer and the reader's caches: ``add``/``flush`` and the planning half of
        # ``sample`` hold it; decoding frames does not (see reader.py), so samplers on other threads
        # (``as_dataset``) and the acting thread's ``add`` mostly run side by side.
        self._mutex = threading.RLock()
        self.ring = Ring(schema.capacity, schema.frame_stack, layout.shard_len)
        self.ring.added = state.added
        self.ring.oldest = state.oldest
        self._writer: Writer | None = None
        self.reader = FrameReader(root, schema, layout, cache_bytes=cache_bytes, decode_threads=decode_threads)
        self._committed = state
        load_scalars(root, schema, layout, self.ring)
        self.ring.rebuild_valid()
        self._priorities = Priorities(self.ring)
        self._head_obs: np.ndarray | None = None
        if not writable:
            self.reader.snapshot()  # read the files of this commit even while a writer moves on
        if writable:
            self._writer = Writer(root, schema, layout, self.ring, self.reader, group_doc, state)
            self.reader.live_region = self._writer.live_region  # frames still in RAM are read from there
        # Closes what this store holds if it is dropped without close(). It refers to the parts only,
        # never to the store, so it does not keep the store alive (and the parts do not refer to it).
        self._finalizer = weakref.finalize(self, _release, self._writer, self.reader, lock, str(root))
        if self._writer is not None and self._episode_in_progress():
            self._head_obs = self._writer.frame_at(state.added - 1)

    # ---------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def create(cls, path: str | Path, capacity: int, observation_space: Any, action_space: Any, frame_stack: int = 1, *,
               layout: Layout | None = None, overwrite: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES,
               memory_budget: int | None = None, decode_threads: int = 1) -> ReplayStore:
        """Create a store for ``capacity`` steps and open it for appending.

        RAM: see ``memory_estimate``; with ``memory_budget`` (bytes) a configuration whose estimate
        exceeds it is refused before anything is written. ``decode_threads`` > 1 decodes each batch's
        chunks on that many threads.

        Example:
            >>> store = ReplayStore.create("/tmp/doc2.zarr", 4096, gym.spaces.Box(0, 255, (84, 84), np.uint8),
            ...                            gym.spaces.Discrete(4), frame_stack=4, overwrite=True)  # doctest: +SKIP
        """
        root = Path(path)
        box = box_from_space(observation_space)
        discrete = discrete_from_space(action_space)
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or not 2 <= capacity <= MAX_CAPACITY:
            raise ConfigError(f"capacity is {capacity!r}; it must be an int between 2 and {MAX_CAPACITY} steps")
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, numbers.Integral) or not 1 <= frame_stack <= 1024:
            raise ConfigError(f"frame_stack is {frame_stack!r}; it must be an int between 1 and 1024 (4 for Atari)")
        layout = layout or default_layout(box.frame_bytes, int(capacity))
        validate_layout(layout, int(capacity))
        schema = Schema(box, discrete, int(capacity), int(frame_stack))
        check_config(schema, layout, root, writable=True, cache_bytes=cache_bytes, memory_budget=memory_budget,
                      decode_threads=decode_threads)

        lock = claim_directory(root, overwrite=overwrite)
        try:
            create_array_metadata(root, "obs", length=schema.capacity, item_shape=box.shape, dtype=box.dtype,
                                  chunk_len=layout.obs_chunk_len, shard_len=layout.shard_len, codec=layout.codec)
            for name, dtype in SCALAR_FIELDS.items():
                create_array_metadata(root, name, length=schema.capacity, item_shape=(), dtype=dtype,
                                      chunk_len=layout.shard_len, shard_len=layout.shard_len, codec=layout.codec)
            # The group's zarr.json goes last, whole and atomically: until it exists the directory is
            # not a store, so a reader never sees one half made.
            state = State()
            doc = {"attributes": {ATTR_KEY: to_attrs(schema, layout, state)}, "zarr_format": 3,
                   "consolidated_metadata": None, "node_type": "group"}
            write_group_json(root, doc)
        except BaseException:
            lock.release()
            raise
        log.info("created replay store %s (capacity %d, layout %s)", root, capacity, layout)
        return cls(root, schema, layout, state, doc, writable=True, cache_bytes=cache_bytes, lock=lock,
                   decode_threads=decode_threads, memory_budget=memory_budget)

    @classmethod
    def open(cls, path: str | Path, mode: str = "r", *, cache_bytes: int = DEFAULT_CACHE_BYTES,
             memory_budget: int | None = None, decode_threads: int = 1) -> ReplayStore:
        """Open an existing store: ``mode="r"`` to read (any number of readers), ``"a"`` to append.

        ``cache_bytes``, ``memory_budget`` and ``decode_threads`` are as for ``create``.

        Example:
            >>> store = ReplayStore.open("/tmp/doc.zarr")
            >>> len(store) > 0
            True
        """
        if mode not in ("r", "a"):
            raise ConfigError(f"mode is {mode!r}; use 'r' to read or 'a' to append")
        root = Path(path)
        doc = read_group_doc(root)
        schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
        check_arrays(root, schema, layout)
        check_config(schema, layout, root, writable=mode == "a", cache_bytes=cache_bytes, memory_budget=memory_budget,
                      decode_threads=decode_threads)
        lock = None
        if mode == "a":
            lock = WriterLock(root)
            lock.acquire()
            try:
                doc = read_group_doc(root)  # re-read under the lock: the last writer may just have committed
                schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
                removed = remove_partials(root)
                if removed:
                    log.info("removed %d temporary files left by an interrupted writer in %s", removed, root)
                return cls(root, schema, layout, state, doc, writable=True, cache_bytes=cache_bytes, lock=lock,
                           decode_threads=decode_threads, memory_budget=memory_budget)
            except BaseException:
                lock.release()
                raise
        # A writer may commit while we load. It always commits a higher live start *before* it
        # overwrites any step, so every step at or above the live start committed *after* our loads
        # was intact in the files we read (scalars) and opened (frame shards, kept open): drop the
        # steps below it from this view and the view is consistent, with no retry.
        for _ in range(100):
            try:
                store = cls(root, schema, layout, state, doc, writable=False, cache_bytes=cache_bytes, lock=None,
                            decode_threads=decode_threads, memory_budget=memory_budget)
            except CorruptStoreError:
                doc = read_group_doc(root)
                _, _, again = from_attrs(doc.get("attributes"), path=str(root))
                if again.live_start(schema.capacity) == state.live_start(schema.capacity):
                    raise  # nothing moved: the store really is damaged
                state = again  # torn by a writer overwriting what we read: load again at the new state
                continue
            doc = read_group_doc(root)
            _, _, again = from_attrs(doc.get("attributes"), path=str(root))
            safe_lo = again.live_start(schema.capacity)
            if safe_lo <= state.live_start(schema.capacity):
                return store
            if safe_lo < state.added:
                store._hide_below(safe_lo)
                return store
            store.close()
            state = again  # the writer lapped everything we loaded: load again at the new state
        raise StoreLockedError(f"{root} is being rewritten faster than it can be read; open it again")

    def close(self) -> None:
        """Flush (when writing), release the writer lock and free file handles. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            try:
                if self._writer is not None:
                    self._writer.flush()
            finally:
                self._closed = True
                self._finalizer.detach()
                _release(None, self.reader, self._lock, str(self.path))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # Reading

    def __len__(self) -> int:
        """Transitions that ``sample`` can return (at most ``capacity``)."""
        return self.ring.n_valid

    @property
    def committed(self) -> State:
        """The state last committed to disk (what a reader opened now would see)."""
        return self._writer.committed if self._writer is not None else self._committed

    @property
    def capacity(self) -> int:
        return self.schema.capacity

    @property
    def frame_stack(self) -> int:
        return self.schema.frame_stack

    @property
    def added(self) -> int:
        """Steps ever written (flushed or not)."""
        return self.ring.added

    @property
    def episodes(self) -> int:
        """Episodes ever started in this store (as committed, or as written by this writer)."""
        return self._writer.episodes if self._writer is not None else self._committed.episodes

    @property
    def episode_in_progress(self) -> bool:
        """True when the last step added awaits its move (the next ``add`` must continue from it)."""
        return self._episode_in_progress()

    @property
    def observation_space(self) -> Any:
        return self.schema.observation.to_space()

    @property
    def action_space(self) -> Any:
        return self.schema.action.to_space()

    def __repr__(self) -> str:
        return f"ReplayStore({str(self.path)!r}, mode={self.mode!r}, transitions={len(self)}, capacity={self.capacity})"

    # ---------------------------------------------------------------------------------------------
    # Validation

    def _hide_below(self, oldest: int) -> None:
        """Drop steps below ``oldest`` from a read-only view (a writer has since overwritten them)."""
        self.ring.set_oldest(oldest)
        self._committed = dataclasses.replace(self._committed, oldest=oldest)

    def _episode_in_progress(self) -> bool:
        ring = self.ring
        return ring.added > 0 and not bool(ring.is_last[(ring.added - 1) % ring.capacity])

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path} was closed; open it again with ReplayStore.open")

    def _require_writer(self, what: str) -> Writer:
        self._check_open()
        if self._writer is None:
            raise ReadOnlyError(f"cannot {what}: {self.path} is open read-only; open it with mode='a' to append")
        return self._writer


def _release(writer: Writer | None, reader: FrameReader, lock: WriterLock | None, path: str) -> None:
    """Close a store's parts: what ``close`` does, and what a store dropped without ``close`` gets
    when it is garbage-collected (a writer's last steps are flushed, like a file's buffer)."""
    try:
        if writer is not None:
            try:
                writer.flush()
            except Exception as exc:  # noqa: BLE001 - a finalizer cannot raise; say what was lost
                log.warning("replay store %s was dropped without close() and its last flush failed (%s); it "
                            "reopens at its last commit", path, exc)
    finally:
        reader.close()
        if lock is not None:
            lock.release()
