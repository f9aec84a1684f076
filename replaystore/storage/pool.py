"""Memory for batches and blocks of batches, made once and handed out again: fresh memory costs page
faults (a 1-2 MB block per batch cost more than decoding the batch), so the read path and the
prefetcher recycle theirs.

Recycling must never hand out memory an array still shows. Each time memory is handed out it is
wrapped in a new numpy array made from the buffer itself (``np.frombuffer``); every array cut from
it (views, slices, reshapes, a TensorFlow tensor wrapping it, a JAX array aliasing it) refers to
that root array, and numpy's own rule makes each view's ``base`` that root. A weak reference to the
root, with a callback, gives the memory back once the root is garbage: when no array of it is left,
whoever held it and however long. This holds under any garbage collector, since an array that is
still reachable is never collected; a late collection only means fresh memory for a while, never
memory in use. (It replaces a check of ``sys.getrefcount``, which depends on how CPython counts
references.) A consumer that is done with a block says so (``Block.release``, feed/blocks.py): that
drops the block's own references at once, so its memory comes back as soon as the consumer holds
no array of it.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import numpy as np


class _GiveBack:
    """A weak reference's callback: piece ``i`` is free again."""

    __slots__ = ("free", "i")

    def __init__(self, free: collections.deque[int], i: int) -> None:
        self.free, self.i = free, i

    def __call__(self, _: object) -> None:
        self.free.append(self.i)


class MemoryPool:
    """Up to ``limit`` pieces of memory, handed out as uint8 arrays and taken back when unreferenced.

    ``memory``: the pieces to hand out (slices of shared memory, all of one size); without it, the
    pool makes ``bytearray``s as they are asked for, up to ``limit``. When every piece is in use,
    ``take`` returns fresh, unpooled memory (``pooled`` False), which is simply freed after use.
    """

    def __init__(self, limit: int, memory: list[Any] | None = None) -> None:
        self.limit = limit if memory is None else len(memory)
        self._fixed = memory is not None
        self._memory: list[Any] = list(memory or [])
        self._free: collections.deque[int] = collections.deque(range(len(self._memory)))  # appended by callbacks
        self._watch: dict[int, weakref.ref] = {}  # piece -> a weak reference to its root handed out
        self._grow = threading.Lock()
        self.made = 0  # pieces of memory made so far, pooled or not (recycling keeps this small)

    def take(self, nbytes: int) -> tuple[np.ndarray, int | None]:
        """A uint8 array of at least ``nbytes``, and the index of its piece in the pool (None: fresh
        memory outside the pool). The piece is not handed out again while any array of it lives."""
        free = self._free
        for _ in range(len(free)):
            try:
                i = free.popleft()
            except IndexError:
                break
            if len(self._memory[i]) >= nbytes:
                return self._hand_out(i), i
            free.append(i)  # too small for this request: left for others
        with self._grow:
            if len(self._memory) < self.limit and not self._fixed:
                self._memory.append(bytearray(nbytes))
                self.made += 1
                return self._hand_out(len(self._memory) - 1), len(self._memory) - 1
        self.made += 1
        return np.empty(nbytes, dtype=np.uint8), None

    def _hand_out(self, i: int) -> np.ndarray:
        root = np.frombuffer(self._memory[i], dtype=np.uint8)
        # the callback runs when ``root`` dies (it refers to the pool's list of free pieces, never to
        # ``root``); the reference is kept until the piece is handed out again
        self._watch[i] = weakref.ref(root, _GiveBack(self._free, i))
        return root

    @property
    def memory(self) -> list[Any]:
        """The pooled pieces of memory (buffers), as made so far."""
        return list(self._memory)

    @property
    def in_use(self) -> int:
        """Pieces handed out and not yet given back."""
        return len(self._memory) - len(self._free)
