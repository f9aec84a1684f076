"""Background sampling: blocks of batches drawn on worker threads, handed out in a fixed order.

A *block* is ``batches_per_block`` batches drawn by one planning step of a ``Sampler``
(sampling/samplers.py), each field viewed as ``(batches_per_block, batch_size, ...)``: one plan,
one decode pass and one hand-over per block instead of per batch, which is what makes the
Python -> TensorFlow bridge cheap (tfdata.py). What a block holds is the sampler's ``spec``:
transitions (uniform or prioritized) or sequences. Block ``j`` is drawn with its own generator,
``default_rng([seed, j])``, so what block ``j`` holds does not depend on which thread drew it or
when: a seeded prefetcher over an unchanging store yields the same batches every run.

Up to ``depth`` blocks are in flight on a thread pool of ``threads`` workers; ``next_block`` waits
for the oldest and queues the next, so the consumer never waits while the workers keep up. Decoding
runs outside the store's lock (storage/reader.py), so workers run side by side with each other and
with an acting thread that ``add``s to the same store. With prioritized sampling the batches of a
block share the priorities of the moment it was drawn (like any prefetching prioritized sampler).

With ``processes`` (the default where it is available, see decodeprocs.py, unless the store keeps
its frames decoded: small frames, storage/mirror.py) a block is planned on a
worker thread as before, but decoded and gathered by one of ``threads`` decode *processes* into
block memory shared with them, so that the decoding does not wait for the GIL beside a consumer.
There are then two threads per process, so that one plans the next block while the other's is
decoded. The batches are the same either way.

A block's frame memory is made once and recycled (storage/pool.py): it goes back to the pool when
the consumer has released the block (``Block.release``) or dropped it, and no array of it is left.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from replaystore.errors import SampleError
from replaystore.feed.block import Block
from replaystore.feed.decodeprocs import DecodeProcesses, unavailable
from replaystore.format.extras import group
from replaystore.format.schema import Layout, Schema
from replaystore.sampling.memory import prefetch_estimate
from replaystore.sampling.pending import Pending
from replaystore.sampling.samplers import Sampler
from replaystore.storage.pool import MemoryPool
from replaystore.storage.reader import FrameReader

#: Frame blocks a consumer may still hold beyond those in flight (tf.data's prefetch buffer).
BLOCKS_IN_USE = 4
#: TensorFlow wraps a numpy array without copying it only when its data is aligned to 64 bytes
#: (Eigen's alignment with AVX-512); numpy's own arrays are aligned to 16.
ALIGN = 64


class Source(Protocol):
    """What a prefetcher draws from (a ``ReplayStore``'s reading half, store/reading.py)."""

    @property
    def schema(self) -> Schema: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def reader(self) -> FrameReader: ...

    def plan(self, sampler: Sampler, batch_size: int, *, rng: np.random.Generator | None = None, batches: int = 1,
             out: list[np.ndarray] | None = None) -> Pending: ...

    def admit_prefetcher(self, prefetcher: Any) -> None: ...


def frame_arrays(owner: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, count: int) -> list[np.ndarray]:
    """``count`` arrays of ``shape`` in ``owner``'s memory (from ``frame_nbytes``), each starting on an
    ``ALIGN``-byte boundary."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    stride = -(-nbytes // ALIGN) * ALIGN
    start = -owner.ctypes.data % ALIGN
    return [owner[start + i * stride : start + i * stride + nbytes].view(dtype).reshape(shape) for i in range(count)]


def frame_nbytes(shape: tuple[int, ...], dtype: np.dtype, count: int) -> int:
    """The bytes of memory ``frame_arrays`` cuts ``count`` aligned ``shape`` arrays from."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return count * (-(-nbytes // ALIGN) * ALIGN) + ALIGN


class Prefetcher:
    """Draws blocks of ``sampler``'s batches from ``source`` ahead of the consumer, in order."""

    def __init__(self, source: Source, sampler: Sampler, batch_size: int, *, batches_per_block: int = 8,
                 threads: int = 2, depth: int = 4, seed: int | None = None, processes: bool | None = None,
                 held: int = BLOCKS_IN_USE) -> None:
        """``held``: blocks the consumer may hold besides those in flight (a device feeder's queue
        counts); up to ``depth + held`` blocks of memory are made once and recycled."""
        for name, value in (("batch_size", batch_size), ("batches_per_block", batches_per_block),
                            ("threads", threads), ("depth", depth), ("held", held)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SampleError(f"{name} is {value!r}; it must be a positive int")
        self.source = source
        self.sampler = sampler
        self.batch_size = batch_size
        self.batches_per_block = batches_per_block
        self.depth = depth
        self.held = held
        source.plan(sampler, batch_size, rng=np.random.default_rng(0)).finish(source.reader)  # bad arguments fail now
        self.seed = int(np.random.default_rng().integers(2**63)) if seed is None else int(seed)
        why_not = unavailable(source.reader)
        if processes and why_not:
            raise SampleError(f"decode processes were asked for, but {why_not}; pass processes=False "
                              "(or None: processes where available) to decode on threads")
        schema = source.schema
        self.spec = {name: ((batches_per_block, *shape), dtype)
                     for name, (shape, dtype) in sampler.spec(batch_size, schema).items()}
        frame_shape, self.frame_dtype = self.spec[sampler.frames[0]]
        self.frame_shape = frame_shape
        self.block_nbytes = frame_nbytes(frame_shape, self.frame_dtype, len(sampler.frames))
        # by default not where the store keeps its frames decoded (small frames, storage/mirror.py):
        # there a block is copied from RAM on the thread, and processes would decode it all again
        use_processes = bool(processes or (processes is None and why_not is None and source.reader.mirror is None))
        #: bytes of RAM this prefetcher holds, by part (counted in ``store.memory_estimate()``)
        ndim = len(schema.observation.shape)
        self.memory = prefetch_estimate(schema, source.layout, block_nbytes=self.block_nbytes,
                                        batches_per_block=batches_per_block,
                                        frames_per_batch=len(sampler.frames) * int(np.prod(frame_shape[1:-ndim])),
                                        threads=threads, blocks=depth + held, processes=use_processes,
                                        chunk_payload_bytes=source.reader.mean_chunk_bytes())
        source.admit_prefetcher(self)  # refused here, before anything starts, if it does not fit
        self.processes: DecodeProcesses | None = None
        if use_processes:
            self.processes = DecodeProcesses(source.reader, processes=threads, blocks=depth + held,
                                             block_nbytes=self.block_nbytes)
            self.pool = MemoryPool(depth + held, memory=self.processes.memory)  # shared with the processes
        else:
            self.pool = MemoryPool(depth + held)
        self._pool = ThreadPoolExecutor(threads * (2 if self.processes else 1), thread_name_prefix="replaystore-sample")
        self._inflight: collections.deque[Future] = collections.deque()
        self._next = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def blocks_made(self) -> int:
        """Frame blocks allocated so far (recycling keeps this small)."""
        return self.pool.made

    def next_block(self) -> Block:
        """The next block: each field shaped ``(batches_per_block, batch_size, ...)``."""
        with self._lock:
            if self._closed:
                raise SampleError("this prefetcher was closed")
            while len(self._inflight) < self.depth:
                self._inflight.append(self._pool.submit(self._draw, self._next))
                self._next += 1
            future = self._inflight.popleft()
            self._inflight.append(self._pool.submit(self._draw, self._next))
            self._next += 1
        block: Block = future.result()
        return block

    def close(self) -> None:
        """Stop the workers: the decode processes first (a hung one is killed after
        ``decodeprocs.CLOSE_TIMEOUT`` seconds, and the blocks it held are finished on the threads),
        then the threads, which then have at most a block each to finish."""
        with self._lock:
            self._closed = True
            for f in self._inflight:
                f.cancel()
            self._inflight.clear()
        if self.processes is not None:
            self.processes.close()
        self._pool.shutdown(wait=True)

    def _draw(self, j: int) -> Block:
        """Block ``j``: its batches drawn with ``default_rng([seed, j])`` and planned in one locked
        step (``source.plan(..., batches=k)``), then each batch's frames decoded and gathered
        straight into the block's frame arrays (no copy).

        The decoding and gathering go to a decode process when the block's memory is shared with
        them, else they run here. One planning step for the whole block keeps the GIL-holding Python
        work to a fraction of a per-batch draw. Decoding stays per batch: a whole block's chunks
        decoded before any is gathered would fall out of the CPU cache."""
        rng = np.random.default_rng([self.seed, j])
        k, sampler = self.batches_per_block, self.sampler
        owner, index = self.pool.take(self.block_nbytes)
        frames = frame_arrays(owner, self.frame_shape, self.frame_dtype, len(sampler.frames))
        del owner  # only the arrays of the block refer to its memory now
        pending = self.source.plan(sampler, self.batch_size, rng=rng, out=frames, batches=k)
        reader = self.source.reader
        reader.fetch(pending.plans)  # cache misses, read here without the store's lock
        done = self.processes.fill(pending.plans, frames) if self.processes is not None and index is not None else 0
        for plan in pending.plans[done:]:  # on this thread: no processes, or a batch they could not decode
            reader.finish(plan)
        if pending.complete is not None:  # (hindsight relabelling)
            pending.complete(dict(zip(sampler.frames, frames)), pending.fields)
        view = self.source.schema.obs_view  # a Dict store's frames as dicts of views
        fields = {name: view(array) for name, array in zip(sampler.frames, frames)}
        for name, values in pending.fields.items():
            fields[name] = values.reshape(self.spec[name][0])
        return Block(group({name: fields[name] for name in self.spec}))  # (the extras as one dict)
