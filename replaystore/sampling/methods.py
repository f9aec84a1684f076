"""The reading half of ``ReplayStore``: sampling (uniform, prioritized, n-step), priorities, the
tf.data pipeline, and the cache and RAM reports. A mixin, so ``store.py`` keeps construction,
writing and the lifecycle; both halves share the store's ring, reader and lock.

``sample`` is split in two: ``plan_sample`` (under the store's lock) draws positions and reads
everything a batch needs from the ring; ``Pending.finish`` decodes the frames without the lock, so
samplers on several threads and an acting thread that adds run side by side.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import SampleError
from replaystore.format.schema import Layout, Schema
from replaystore.sampling import sampler as _sampler
from replaystore.sampling.assemble import Batch, Pending, prepare
from replaystore.sampling.memory import check_budget, estimate
from replaystore.sampling.priority import Priorities
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings


class Sampling:
    """Sampling methods of ``ReplayStore`` (see store.py for the attributes they use)."""

    path: Path
    schema: Schema
    layout: Layout
    rings: Rings
    writing: list[int]
    reader: FrameReader
    _mutex: threading.RLock
    _priorities: Priorities
    _writer: Any
    _memory_budget: int | None
    _prefetchers: Any  # a WeakSet of the live prefetchers over this store
    capacity: int  # a property of ReplayStore
    _check_open: Callable[[], None]  # ReplayStore's: raises StoreClosedError after close()

    def sample(self, batch_size: int, *, rng: np.random.Generator | None = None, n_step: int = 1,
               gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4) -> Batch:
        """Sample ``batch_size`` transitions with replacement: uniformly, or by priority.

        ``n_step`` > 1 returns the discounted n-step reward, the observation up to ``n_step`` moves
        ahead and ``discount = gamma**k`` (0 after a termination). With ``prioritized=True`` a
        transition is drawn with probability ``p**alpha / sum p**alpha`` and ``weight`` holds its
        importance weight ``(N P(i))**-beta``, normalised so the largest possible weight is 1; set
        priorities with ``update_priorities(batch.index, new_priorities)``. Safe to call from
        several threads and alongside ``add`` (decoding runs outside the store's lock).

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").sample(4, rng=np.random.default_rng(1), n_step=3).discount.shape
            (4,)
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise SampleError(f"batch_size is {batch_size!r}; it must be a positive int")
        if isinstance(n_step, bool) or not isinstance(n_step, numbers.Integral) or not 1 <= n_step <= 1000:
            raise SampleError(f"n_step is {n_step!r}; it must be an int between 1 and 1000")
        _check_unit(gamma, "gamma")
        if prioritized:
            _check_unit(alpha, "alpha")
            _check_unit(beta, "beta")
        return self.plan_sample(batch_size, rng=rng, n_step=n_step, gamma=gamma, prioritized=prioritized,
                                alpha=alpha, beta=beta).finish(self.reader)

    def plan_sample(self, batch_size: int, *, rng: np.random.Generator | None, n_step: int, gamma: float,
                    prioritized: bool, alpha: float, beta: float, out: tuple[np.ndarray, np.ndarray] | None = None,
                    batches: int = 1) -> Pending:
        """The locked half of ``sample``, for callers that decode the frames elsewhere (the
        prefetcher): draw positions, read the ring, plan the frame reads. Arguments are not checked
        here (``sample`` checks them). ``batches`` > 1 draws that many batches at once (one lock and
        one set of vectorised ring reads for all of them); ``out`` receives the frames, see
        ``assemble.prepare``. The returned ``Pending`` is finished with ``pending.finish(reader)``
        or plan by plan, without the store's lock."""
        rng = rng if rng is not None else np.random.default_rng()
        with self._mutex:
            self._check_open()
            available = _sampler.count_sampleable(self.rings, int(n_step))
            if batch_size > available:
                raise SampleError(
                    f"asked for {batch_size} transitions but {self.path} holds {available} sampleable "
                    f"(n_step={n_step}); add more transitions first or sample at most {available}"
                )
            weight = None
            if prioritized:
                tree = self._priorities.sync(float(alpha))
                positions = _sampler.sample_prioritized(self.rings, tree, batches * int(batch_size), rng,
                                                        n_step=int(n_step))
                weight = self._priorities.weights(tree, self.rings.slots(positions), float(beta))
            else:
                positions = _sampler.sample_uniform(self.rings, batches * int(batch_size), rng, n_step=int(n_step))
            return prepare(self.rings, self.reader, positions, n_step=int(n_step), gamma=float(gamma), weight=weight,
                           out=out, batches=batches)

    def as_dataset(self, batch_size: int, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False,
                   alpha: float = 0.6, beta: float = 0.4, prefetch: int = 4, threads: int = 2,
                   batches_per_call: int = 8, seed: int | None = None, device: str | None = "auto",
                   processes: bool | None = None, blocks: bool = False) -> Any:
        """An endless ``tf.data.Dataset`` of sampled batches, drawn in the background.

        Each element is a dict with the ``Batch`` fields (``obs``, ``action``, ``reward``,
        ``next_obs``, ``terminated``, ``truncated``, ``discount``, ``index``, ``weight``) and a
        fixed ``element_spec``. ``threads`` workers draw ``batches_per_call`` batches per call ahead
        of the consumer and ``prefetch`` batches are kept ready. A larger ``batches_per_call``
        spreads the bridge's per-call cost over more batches (the trainer uses 32; see
        docs/sampling.md) but holds more RAM: a block holds
        ``batches_per_call`` batches of frames (``obs`` and ``next_obs``: 1.8 MB for Atari at batch
        32), and up to ``threads + ceil(prefetch / batches_per_call) + 4`` blocks can be alive (the
        default, 8, with 2 threads and prefetch 4: ~100 MB for Atari). ``device="auto"`` places batches on the
        first GPU when there is one (a device string picks one, None keeps them on the CPU). With a
        ``seed`` and a store that is not being written, the batches are the same every run. Works
        while this process ``add``s to the store (the trainer does). Imports TensorFlow.

        ``processes``: where the workers decode. By default (None) ``threads`` decode *processes*
        are started where that is possible (Linux, libzstd, a zstd-coded store): they decode and
        gather the frames straight into block memory shared with this process, while planning
        stays on the threads, so the decoding does not wait for the GIL beside the consumer
        (docs/design.md, "Feeding a learner"). False decodes on the threads; True insists on
        processes (an error says why they cannot run). The batches are the same either way.

        Returns a ``tfdata.ReplayDataset``: a ``tf.data.Dataset`` whose ``prefetcher`` owns the
        worker threads and processes (``dataset.prefetcher.close()`` stops them; they also stop when
        this process ends).

        Example:
            >>> ds = ReplayStore.open("/tmp/doc.zarr").as_dataset(8, seed=0)  # doctest: +SKIP
            >>> next(iter(ds))["obs"].shape  # doctest: +SKIP
            TensorShape([8, 2, 4])
        """
        from replaystore.feed.tfdata import as_dataset

        self._check_open()
        return as_dataset(self, batch_size, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta,
                          prefetch=prefetch, threads=threads, batches_per_call=batches_per_call, seed=seed, device=device,
                          processes=processes, blocks=blocks)

    def blocks(self, batch_size: int, *, batches_per_block: int = 8, n_step: int = 1, gamma: float = 0.99,
               prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, threads: int = 2, depth: int = 4,
               seed: int | None = None, processes: bool | None = None) -> Any:
        """An endless iterator of sampled *blocks*, drawn in the background: each a dict of numpy
        arrays with the ``Batch`` fields, shaped ``(batches_per_block, batch_size, ...)`` (row ``i``
        is batch ``i``). For any learner, whatever its framework: one that runs ``batches_per_block``
        gradient steps per compiled call takes a block at a time. ``threads``, ``depth`` (blocks in
        flight), ``seed`` and ``processes`` are as for ``as_dataset``; the same seed gives the same
        blocks as ``as_dataset(..., batches_per_call=batches_per_block)`` cuts into batches.

        A block's memory is reused only once nothing refers to it, so a block may be kept as long as
        needed. Returns a ``feed.blocks.BlockIterator``; ``close()`` (or ``with``) stops its workers.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr").blocks(8, batches_per_block=4, seed=0) as it:  # doctest: +SKIP
            ...     next(it)["obs"].shape
            (4, 8, 2, 4)
        """
        from replaystore.feed.blocks import BlockIterator

        self._check_open()
        return BlockIterator(self, batch_size, batches_per_block=batches_per_block, n_step=n_step, gamma=gamma,
                             prioritized=prioritized, alpha=alpha, beta=beta, threads=threads, depth=depth, seed=seed,
                             processes=processes)

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
        return DeviceBlocks(self, batch_size, device=device, depth=depth, batches_per_block=batches_per_block, **kwargs)

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (``batch.index``) to ``priority``.

        Priorities must be finite and >= 0 (typically ``|td_error| + eps``); they are clipped below to
        1e-6 so no transition is starved. A writer saves them with its next flush, so a reopened store
        samples with them; a read-only store keeps them in RAM only.
        """
        idx = np.asarray(index)
        prio = np.asarray(priority)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise SampleError(f"index must be a 1-D integer array such as batch.index, got {idx.dtype} of shape {idx.shape}")
        if prio.shape != idx.shape or prio.dtype.kind not in "iuf":
            raise SampleError(f"priority must be a numeric array of shape {idx.shape} (one per index), got {prio.dtype} of shape {prio.shape}")
        size = self.rings.size
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            raise SampleError(f"index holds slots outside 0..{size - 1}; pass batch.index from this store")
        if prio.size and not (np.all(np.isfinite(prio)) and prio.min() >= 0):
            raise SampleError("priorities must be finite and >= 0 (use |td_error| + a small epsilon)")
        if idx.size == 0:
            return
        with self._mutex:
            self._check_open()
            self._priorities.update(idx.astype(np.int64), prio.astype(np.float64))

    def priorities(self, index: Any) -> np.ndarray:
        """The current priorities (before ``alpha``) of the slots in ``index``, as float32."""
        idx = np.asarray(index)
        size = self.rings.size
        if idx.dtype.kind not in "iu" or (idx.size and (idx.min() < 0 or idx.max() >= size)):
            raise SampleError(f"index must hold integer slots in 0..{size - 1}, such as batch.index")
        with self._mutex:
            return self.rings.priority[idx].copy()

    def warm_cache(self) -> int:
        """Read the store's compressed frame chunks into the cache now, shard by shard (up to
        ``cache_bytes``), so sampling never waits on a disk read; returns the bytes loaded. A 1M-frame
        Atari store is ~65 MB and loads in about a second."""
        with self._mutex:
            self._check_open()
            n_shards = -(-self.rings.size // self.layout.shard_len)
            return self.reader.warm(range(n_shards))

    def memory_estimate(self) -> dict[str, int]:
        """Bytes of RAM each part of this store can use, its live prefetchers' (``as_dataset``) blocks
        and decode processes included (see memory.py); ``sum(...values())`` for the total."""
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

    @property
    def cache_hit_rate(self) -> float:
        """Fraction of on-disk chunk lookups served from the compressed-chunk cache."""
        return self.reader.hit_rate

    @property
    def cache_bytes_held(self) -> int:
        """Compressed chunk bytes held in RAM by the cache (at most ``cache_bytes``)."""
        return self.reader.bytes_held


def _check_unit(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise SampleError(f"{name} is {value!r}; it must be a number in [0, 1]")
