"""``ReplayStore.blocks``: sampled batches as blocks of numpy arrays, for any learner.

The backend-neutral way to feed a learner. Each block is ``batches_per_block`` batches drawn ahead
by the ``Prefetcher`` (prefetch.py: worker threads, and decode processes where available), as a dict
of numpy arrays shaped ``(batches_per_block, batch_size, ...)``: a learner that runs several
gradient steps per device call (``lax.scan``, ``tf.while_loop``) takes a whole block at a time; one
that runs a step per batch slices ``block["obs"][i]``. ``as_dataset`` (TensorFlow, tfdata.py) and
``jax_blocks`` (jaxfeed.py) are built on the same blocks.

Recycling is safe by construction: a block's frame memory is reused only when no array refers to
it any more (its reference count, prefetch.py), so a consumer may keep a block, or any view of it,
as long as it likes; it then simply costs a fresh block of memory. Dropping blocks promptly keeps
the RAM at ``prefetcher.memory``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

import numpy as np

from replaystore.feed.prefetch import BLOCKS_IN_USE, Prefetcher

if TYPE_CHECKING:
    from replaystore.store import ReplayStore


class BlockIterator:
    """An endless iterator of blocks (dicts of numpy arrays) drawn in the background; ``close()``
    (or leaving a ``with`` block) stops its workers."""

    def __init__(self, store: ReplayStore, batch_size: int, *, batches_per_block: int = 8, n_step: int = 1,
                 gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 threads: int = 2, depth: int = 4, seed: int | None = None, processes: bool | None = None,
                 held: int = BLOCKS_IN_USE) -> None:
        self.prefetcher = Prefetcher(store, batch_size, batches_per_block=batches_per_block, threads=threads,
                                     depth=depth, seed=seed, n_step=n_step, gamma=gamma, prioritized=prioritized,
                                     alpha=alpha, beta=beta, processes=processes, held=held)
        self.batch_size = batch_size
        self.batches_per_block = batches_per_block

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return self.prefetcher.next_block()

    def close(self) -> None:
        self.prefetcher.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
