"""A feeder thread that moves sampled blocks onto a device ahead of the learner: the part
``jax_blocks`` (jaxfeed.py) and ``torch_blocks`` (torchfeed.py) share; each gives it ``move``, the
function that puts a block's numpy arrays where its framework wants them.

The learner's bound is a call that runs a block's gradient steps on the device; what keeps it busy
is having the *next* block there when the call returns. The feeder takes blocks from the
``Prefetcher`` (numpy, blocks.py) and calls ``move`` on each while the learner trains on the one
before, ``depth`` blocks ahead. ``index`` stays a numpy array (it is for ``update_priorities``).

Memory: the feeder releases each numpy block once its arrays are taken and calls ``move`` on them;
``move`` returns only once its copies are done (or holds the numpy arrays in what it returns, as a
zero-copy tensor does), so the prefetcher never reuses host memory a transfer still reads
(storage/pool.py reuses it only once no array refers to it).

Errors in the feeder (a closed store, a device out of memory) are raised by the next ``next()``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Self

from replaystore.errors import SampleError
from replaystore.feed.blocks import BlockIterator
from replaystore.feed.prefetch import BLOCKS_IN_USE, Source
from replaystore.sampling.samplers import Sampler

_STOP = object()


class Feeder:
    """An endless iterator of blocks moved by ``move`` (a dict of numpy arrays, but ``index``, to a
    dict of the framework's arrays), ``depth`` blocks ahead; ``close()`` (or leaving a ``with``
    block) stops the feeder thread and the prefetcher's workers. ``device``: where ``move`` puts
    them (kept for the caller to read); ``name``: the thread's."""

    def __init__(self, source: Source, sampler: Sampler, batch_size: int, *, move: Callable[[dict[str, Any]], dict[str, Any]],
                 depth: int = 2, device: Any = None, name: str = "replaystore-device-feeder",
                 **block_kwargs: Any) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise SampleError(f"depth is {depth!r}; it must be a positive int (blocks kept on the device ahead)")
        self._move = move
        self.device = device
        # The blocks in the queue and the one being moved are held too, besides the learner's.
        self.blocks = BlockIterator(source, sampler, batch_size, held=BLOCKS_IN_USE + depth + 1, **block_kwargs)
        self.prefetcher = self.blocks.prefetcher
        self.depth = depth
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name=name, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        try:
            while not self._stop.is_set():
                with next(self.blocks) as block:
                    host = dict(block)
                index = host.pop("index")  # host bookkeeping (update_priorities): stays a numpy array
                moved = self._move(host)
                moved["index"] = index
                del host  # the copy is done: the memory is reused once no array (a device alias) holds it
                while not self._stop.is_set():
                    try:
                        self._queue.put(moved, timeout=0.1)
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
