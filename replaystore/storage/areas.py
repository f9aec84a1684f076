"""Each sampling thread's reused memory on the read path: the decode area, recycled output blocks
and a scratch area. Fresh memory costs more than the work on these machines: a fresh 1-2 MB block
per batch costs more in page faults than decoding the batch, so nothing here is allocated per batch."""

from __future__ import annotations

import threading

import numpy as np

from replaystore.storage.pool import MemoryPool

#: Recycled output blocks per sampling thread (enough for a prefetch queue and a training step).
OUTPUT_POOL = 16


class ThreadAreas:
    """Per-thread areas for frames of ``shape`` and ``dtype`` in chunks of ``chunk_len``."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, chunk_len: int) -> None:
        self.shape, self.dtype, self.chunk_len = shape, np.dtype(dtype), chunk_len
        self.frame_nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self._local = threading.local()

    def decode_area(self, n: int) -> np.ndarray:
        """At least ``n`` chunks, ``(m, chunk_len, *shape)``, grown by doubling."""
        area = getattr(self._local, "area", None)
        if area is None or area.shape[0] < n:
            size = max(n, 2 * (0 if area is None else area.shape[0]), 64)
            area = self._local.area = np.empty((size, self.chunk_len, *self.shape), dtype=self.dtype)
        return area

    def output(self, n: int) -> np.ndarray:
        """A ``(n, *shape)`` array for a batch's frames, from this thread's pool of recycled memory
        (pool.py: handed out again only once no array of it is left)."""
        pool = getattr(self._local, "outputs", None)
        if pool is None:
            pool = self._local.outputs = MemoryPool(OUTPUT_POOL)
        root, _ = pool.take(max(n, 256) * self.frame_nbytes)
        return root[: n * self.frame_nbytes].view(self.dtype).reshape(n, *self.shape)

    def scratch(self, n: int) -> np.ndarray:
        """``(n, *shape)`` of this thread's scratch (overwritten by the next call)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.shape[0] < n:
            scratch = self._local.scratch = np.empty((max(n, 256), *self.shape), dtype=self.dtype)
        return scratch[:n]
