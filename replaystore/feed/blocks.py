"""``ReplayStore.blocks``: sampled batches as blocks of numpy arrays, for any learner.

The framework-neutral way to feed a learner. Each block is ``batches_per_block`` batches drawn ahead
by the ``Prefetcher`` (prefetch.py: worker threads, and decode processes where available), as a
``Block`` (block.py) of numpy arrays shaped ``(batches_per_block, batch_size, ...)``: a learner that
runs several gradient steps per device call (``lax.scan``, ``tf.while_loop``) takes a whole block at
a time; one that runs a step per batch slices ``block["obs"][i]``. ``as_dataset`` (TensorFlow,
tfdata.py) and ``jax_blocks`` (jaxfeed.py) are built on the same blocks.

Recycling is safe by construction: a block's frame memory is reused only once no array of it is
left (storage/pool.py), so a consumer may keep a block, or any view of it, as long as it likes; it
then simply costs a fresh block of memory. ``block.release()`` (or ``with block:``) as soon as a
block is used keeps the RAM at ``prefetcher.memory``.
"""

from __future__ import annotations

from typing import Self

from replaystore.feed.block import Block
from replaystore.feed.prefetch import BLOCKS_IN_USE, Prefetcher, Source
from replaystore.sampling.samplers import Sampler


class BlockIterator:
    """An endless iterator of ``sampler``'s blocks drawn in the background; ``close()`` (or leaving a
    ``with`` block) stops its workers."""

    def __init__(self, source: Source, sampler: Sampler, batch_size: int, *, batches_per_block: int = 8,
                 threads: int = 2, depth: int = 4, seed: int | None = None, processes: bool | None = None,
                 held: int = BLOCKS_IN_USE) -> None:
        self.prefetcher = Prefetcher(source, sampler, batch_size, batches_per_block=batches_per_block,
                                     threads=threads, depth=depth, seed=seed, processes=processes, held=held)
        self.batch_size = batch_size
        self.batches_per_block = batches_per_block

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Block:
        return self.prefetcher.next_block()

    def close(self) -> None:
        self.prefetcher.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
