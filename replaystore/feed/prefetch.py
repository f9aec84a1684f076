"""Background sampling: blocks of batches drawn on worker threads, handed out in a fixed order.

A *block* is ``batches_per_block`` batches drawn by one ``store.sample`` call of
``batches_per_block * batch_size`` transitions and viewed as ``(batches_per_block, batch_size, ...)``:
one plan, one decode pass and one hand-over per block instead of per batch, which is what makes the
Python -> TensorFlow bridge cheap (tfdata.py). Block ``j`` is drawn with its own generator,
``default_rng([seed, j])``, so what block ``j`` holds does not depend on which thread drew it or
when: a seeded prefetcher over an unchanging store yields the same batches every run.

Up to ``depth`` blocks are in flight on a thread pool of ``threads`` workers; ``next_block`` waits
for the oldest and queues the next, so the consumer never waits while the workers keep up. Decoding
runs outside the store's lock (see reader.py), so workers run side by side with each other and with
an acting thread that ``add``s to the same store. With prioritized sampling the batches of a block
share the priorities of the moment it was drawn (like any prefetching prioritized sampler).

With ``processes`` (the default where it is available, see decodeprocs.py) a block is planned on a
worker thread as before, but decoded and gathered by one of ``threads`` decode *processes* into
block memory shared with them, so that the decoding does not wait for the GIL beside a consumer.
There are then two threads per process, so that one plans the next
block while the other's is decoded. The batches are the same either way.
"""

from __future__ import annotations

import collections
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from replaystore.errors import SampleError
from replaystore.feed.decodeprocs import DecodeProcesses, unavailable
from replaystore.sampling.memory import prefetch_estimate

if TYPE_CHECKING:
    from replaystore.store import ReplayStore

#: Frame blocks a consumer may still hold beyond those in flight (tf.data's prefetch buffer).
BLOCKS_IN_USE = 4
#: TensorFlow wraps a numpy array without copying it only when its data is aligned to 64 bytes
#: (Eigen's alignment with AVX-512); numpy's own arrays are aligned to 16.
ALIGN = 64

#: A block's fields: ``obs`` and ``next_obs`` are ``(batches_per_block, batch_size, frame_stack,
#: *frame_shape)``, the others ``(batches_per_block, batch_size)``; row ``i`` of each is batch ``i``.
FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated", "discount", "index", "weight")
SCALARS = FIELDS[2:]


def frame_pair(owner: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``obs`` and ``next_obs`` of a block: two ``shape`` arrays in ``owner``'s memory, each starting
    on an ``ALIGN``-byte boundary (``owner`` comes from ``frame_memory``)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    second = -(-nbytes // ALIGN) * ALIGN
    start = -owner.ctypes.data % ALIGN
    return tuple(owner[start + at : start + at + nbytes].view(dtype).reshape(shape) for at in (0, second))


def frame_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The bytes of memory ``frame_pair`` cuts two aligned ``shape`` arrays from."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return 2 * (-(-nbytes // ALIGN) * ALIGN) + ALIGN


def frame_memory(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The memory ``frame_pair`` cuts two aligned ``shape`` arrays from."""
    return np.empty(frame_nbytes(shape, dtype), dtype=np.uint8)


class Prefetcher:
    """Draws blocks of batches from ``store`` ahead of the consumer, in order."""

    def __init__(self, store: ReplayStore, batch_size: int, *, batches_per_block: int = 8, threads: int = 2,
                 depth: int = 4, seed: int | None = None, n_step: int = 1, gamma: float = 0.99,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 processes: bool | None = None, held: int = BLOCKS_IN_USE) -> None:
        """``held``: blocks the consumer may hold besides those in flight (a device feeder's queue
        counts); up to ``depth + held`` blocks of memory are made once and recycled."""
        for name, value in (("batch_size", batch_size), ("batches_per_block", batches_per_block),
                            ("threads", threads), ("depth", depth), ("held", held)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SampleError(f"{name} is {value!r}; it must be a positive int")
        self.store = store
        self.batch_size = batch_size
        self.batches_per_block = batches_per_block
        self.depth = depth
        self.held = held
        self.sample_kwargs = {"n_step": n_step, "gamma": gamma, "prioritized": prioritized, "alpha": alpha, "beta": beta}
        store.sample(batch_size, rng=np.random.default_rng(0), **self.sample_kwargs)  # bad arguments fail here, now
        self.seed = int(np.random.SeedSequence(seed).entropy) if seed is None else int(seed)
        why_not = unavailable(store.reader)
        if processes and why_not:
            raise SampleError(f"decode processes were asked for, but {why_not}; pass processes=False "
                              "(or None: processes where available) to decode on threads")
        schema = store.schema
        self.block_shape = (batches_per_block, batch_size, schema.frame_stack, *schema.observation.shape)
        self.frame_dtype = np.dtype(schema.observation.dtype)
        self._blocks: list[np.ndarray] = []
        self.processes: DecodeProcesses | None = None
        use_processes = bool(processes or (processes is None and why_not is None))
        #: bytes of RAM this prefetcher holds, by part (counted in ``store.memory_estimate()``)
        self.memory = prefetch_estimate(schema, store.layout, batch_size=batch_size, batches_per_block=batches_per_block,
                                        threads=threads, blocks=depth + held, processes=use_processes,
                                        chunk_payload_bytes=store.reader.mean_chunk_bytes())
        store.admit_prefetcher(self)  # refused here, before anything starts, if it does not fit
        if use_processes:
            self.processes = DecodeProcesses(store.reader, processes=threads, blocks=depth + held,
                                             block_nbytes=frame_nbytes(self.block_shape, self.frame_dtype))
            self._blocks = self.processes.take_blocks()  # the shared blocks, made once, recycled
        self._shared = len(self._blocks)
        self._pool = ThreadPoolExecutor(threads * (2 if self.processes else 1), thread_name_prefix="replaystore-sample")
        self._inflight: collections.deque[Future] = collections.deque()
        self._next = 0
        self._lock = threading.Lock()
        self._closed = False
        self.blocks_made = 0  # frame blocks allocated so far (recycling keeps this small)
        self._blocks_lock = threading.Lock()

    def next_block(self) -> dict[str, np.ndarray]:
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
        return future.result()

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

    def _draw(self, j: int) -> dict[str, np.ndarray]:
        """Block ``j``: its transitions drawn with ``default_rng([seed, j])`` and its ring reads done
        in one locked step for all its batches (``store.plan_sample(..., batches=k)``), then each
        batch's frames decoded and gathered straight into the block's frame arrays (no copy).

        The decoding and gathering go to a decode process when the block is in shared memory, else
        they run here. One planning step for the whole block keeps the GIL-holding Python work to a
        fraction of a per-batch draw. Decoding stays per batch: a whole block's chunks decoded
        before any is gathered would fall out of the CPU cache."""
        rng = np.random.default_rng([self.seed, j])
        k, b = self.batches_per_block, self.batch_size
        owner, shared = self._frame_memory()
        pair = frame_pair(owner, self.block_shape, self.frame_dtype)
        del owner  # only the pool and the views may refer to it once the block is handed out
        pending = self.store.plan_sample(b, rng=rng, out=pair, batches=k, **self.sample_kwargs)
        self.store.reader.fetch(pending.plans)  # cache misses, read here without the store's lock
        done = self.processes.fill(pending.plans, pair) if shared else 0
        for plan in pending.plans[done:]:  # on this thread: no processes, or a batch they could not decode
            self.store.reader.finish(plan)
        block = {"obs": pair[0], "next_obs": pair[1]}
        block.update((name, getattr(pending.batch, name).reshape(k, b)) for name in SCALARS)
        return block

    def _frame_memory(self) -> tuple[np.ndarray, bool]:
        """Memory for a block's ``obs`` and ``next_obs`` (see ``frame_pair``), recycled once nothing
        refers to it any more (fresh memory costs page faults; see reader._output), and whether the
        decode processes can write to it (one of their shared blocks). The two frame arrays are
        views of it, and a consumer's tensors hold a reference to the very arrays handed out, so its
        reference count says whether any batch of the block is still alive. With every shared block
        in use (a consumer holding many batches) a block of private memory is decoded on the thread."""
        with self._blocks_lock:
            for i in range(len(self._blocks)):
                if sys.getrefcount(self._blocks[i]) == 2:  # the list's and the call's: nobody else's
                    return self._blocks[i], i < self._shared  # under the lock: no other worker can take it now
            owner = frame_memory(self.block_shape, self.frame_dtype)  # not shared: decoded on this thread
            self.blocks_made += 1
            if not self._shared and len(self._blocks) < self.depth + self.held:
                self._blocks.append(owner)
            return owner, False
