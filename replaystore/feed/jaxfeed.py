"""``ReplayStore.jax_blocks``: sampled blocks already on a JAX device, put there ahead of the learner.

The learner's bound is a compiled call that runs a block's gradient steps on the device; what keeps
it busy is having the *next* block there when the call returns. A feeder thread takes blocks from
the ``Prefetcher`` (numpy, blocks.py) and calls ``jax.device_put`` on each while the learner trains
on the one before, ``depth`` blocks ahead. ``device_put`` releases the GIL while it copies, so the
feeder runs beside the learner's Python.

Memory: the feeder releases each numpy block once its arrays are taken, and lets go of the arrays
only after their copy is done (``block_until_ready``), so the prefetcher never reuses host memory a
transfer still reads. On the CPU backend ``device_put`` may use the numpy memory as the device
array's own (no copy); the device array then holds the numpy array, and its memory is reused only
once the learner has dropped it (storage/pool.py). Either way a block's values never change under
the learner.

Errors in the feeder (a closed store, a device out of memory) are raised by the next ``next()``.
The module imports JAX only when a feeder is made (``import replaystore`` does not).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Self

from replaystore.errors import ConfigError, SampleError
from replaystore.feed.blocks import BlockIterator
from replaystore.feed.prefetch import BLOCKS_IN_USE, Source
from replaystore.sampling.samplers import Sampler

_STOP = object()


class DeviceBlocks:
    """An endless iterator of blocks (dicts of ``jax.Array`` shaped ``(batches_per_block,
    batch_size, ...)``) on ``device``, but for ``index``, which stays a numpy array (it is for
    ``store.update_priorities``); ``close()`` (or leaving a ``with`` block) stops the feeder and the
    prefetcher's workers."""

    def __init__(self, source: Source, sampler: Sampler, batch_size: int, *, device: Any = None, depth: int = 2,
                 **block_kwargs: Any) -> None:
        try:
            import jax
        except ImportError as exc:
            raise ConfigError("jax_blocks needs JAX: pip install 'replaystore[jax]' (or jax[cuda12] for a GPU)") from exc
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise SampleError(f"depth is {depth!r}; it must be a positive int (blocks kept on the device ahead)")
        self._jax = jax
        self.device = jax.devices()[0] if device is None else device
        # The blocks in the queue and the one being put are held too, besides the learner's.
        self.blocks = BlockIterator(source, sampler, batch_size, held=BLOCKS_IN_USE + depth + 1, **block_kwargs)
        self.prefetcher = self.blocks.prefetcher
        self.depth = depth
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="replaystore-device-feeder", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        jax = self._jax
        try:
            while not self._stop.is_set():
                with next(self.blocks) as block:
                    host = dict(block)
                index = host.pop("index")  # host bookkeeping (update_priorities): stays a numpy array
                on_device = jax.block_until_ready(jax.device_put(host, self.device))
                on_device["index"] = index
                del host  # the copy is done: the memory is reused once no array (a device alias) holds it
                while not self._stop.is_set():
                    try:
                        self._queue.put(on_device, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            if not self._stop.is_set():
                self._put_final(exc)
            return
        self._put_final(_STOP)

    def _put_final(self, item: Any) -> None:
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    return

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._stop.is_set():
            raise SampleError("these device blocks were closed")
        item = self._queue.get()
        if item is _STOP:
            raise SampleError("these device blocks were closed")
        if isinstance(item, BaseException):
            self._stop.set()
            raise SampleError(f"the device feeder failed: {item}") from item
        return item

    def close(self) -> None:
        """Stop the feeder thread and the prefetcher; blocks already handed out stay valid."""
        self._stop.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        self.blocks.close()  # the feeder, if it waits on the prefetcher, gets an error and stops
        self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
