"""``ReplayStore.as_dataset``: sampled batches as a ``tf.data.Dataset``. The one module that imports
TensorFlow (``import replaystore`` does not).

The bridge from Python is the cost to beat: measured here, ``from_generator`` delivered ~400 batches/s
and a ``numpy_function`` per batch ~800/s, against thousands a second from the sampler. So each
``numpy_function`` call hands over a whole *block* of batches drawn ahead by ``prefetch.Prefetcher``
on background threads, and the block is cut into batches inside TensorFlow without copying:

- the block's frames are one array, ``(2k, batch, stack, ...)`` with batch ``i``'s ``obs`` and
  ``next_obs`` at rows ``2i`` and ``2i + 1``, aligned to 64 bytes: TensorFlow wraps an aligned
  numpy array as it is, while numpy's usual 16-byte alignment made it copy every block (measured on
  the bridge alone, with pre-made blocks: 5,064 batches/s unaligned, 10,937 aligned);
- ``flat_map`` over ``range(k)`` takes row slices, which TensorFlow shares rather than copies
  (``unbatch`` copies every element: 1.8 MB per Atari batch);
- the workers gather each batch straight into the block (no copy) and recycle a block once no
  tensor refers to it any more (the tensors hold a reference to the very array handed over).

``prefetch`` then keeps batches ready ahead of the consumer. Measured with an empty consumer on
the 1M-frame benchmark store: 1,145 batches/s before these changes, ~2,100-2,300 after, with one
sampling thread (tools/bench_sampling.py has the side-by-side numbers).

Each element is a dict with the fields of ``Batch``; ``index`` and ``weight`` ride along so a learner
can call ``store.update_priorities(batch["index"], new_priorities)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from replaystore.errors import SampleError
from replaystore.prefetch import FIELDS, SCALARS, Prefetcher

if TYPE_CHECKING:
    from replaystore.store import ReplayStore

_DTYPES = {
    "action": tf.int64, "reward": tf.float32, "terminated": tf.bool, "truncated": tf.bool,
    "discount": tf.float32, "index": tf.int64, "weight": tf.float32,
}


def element_spec(store: ReplayStore, batch_size: int) -> dict[str, tf.TensorSpec]:
    """The ``element_spec`` of ``store.as_dataset(batch_size)``."""
    stack = (batch_size, store.frame_stack, *store.schema.observation.shape)
    frame_dtype = tf.as_dtype(np.dtype(store.schema.observation.dtype))
    spec = {"obs": tf.TensorSpec(stack, frame_dtype, name="obs"), "next_obs": tf.TensorSpec(stack, frame_dtype, name="next_obs")}
    spec.update({name: tf.TensorSpec((batch_size,), dtype, name=name) for name, dtype in _DTYPES.items()})
    return spec


def as_dataset(store: ReplayStore, batch_size: int, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False,
               alpha: float = 0.6, beta: float = 0.4, prefetch: int = 4, threads: int = 2, batches_per_call: int = 8,
               seed: int | None = None, device: str | None = "auto") -> tf.data.Dataset:
    """See ``ReplayStore.as_dataset``."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise SampleError(f"prefetch is {prefetch!r}; it must be a positive int (batches kept ready)")
    prefetcher = Prefetcher(store, batch_size, batches_per_block=batches_per_call, threads=threads,
                            depth=max(2, -(-prefetch // batches_per_call) + threads), seed=seed, n_step=n_step,
                            gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta)
    frames_shape = (2 * batches_per_call, batch_size, store.frame_stack, *store.schema.observation.shape)
    frame_dtype = tf.as_dtype(np.dtype(store.schema.observation.dtype))
    out_types = [frame_dtype] + [_DTYPES[name] for name in SCALARS]

    def fetch() -> list[np.ndarray]:
        block = prefetcher.next_block()
        return [block[name] for name in FIELDS]

    def to_block(_: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        values = tf.numpy_function(fetch, [], out_types, stateful=True, name="replaystore_sample")
        frames = tf.ensure_shape(values[0], frames_shape)
        return frames, {name: tf.ensure_shape(v, (batches_per_call, batch_size)) for name, v in zip(SCALARS, values[1:])}

    def batches(frames: tf.Tensor, scalars: dict[str, tf.Tensor]) -> tf.data.Dataset:
        def batch(i: tf.Tensor) -> dict[str, tf.Tensor]:
            # Slices along the first axis of an aligned tensor: TensorFlow shares the block's memory.
            element = {"obs": frames[2 * i], "next_obs": frames[2 * i + 1]}
            element.update({name: value[i] for name, value in scalars.items()})
            return element

        return tf.data.Dataset.range(batches_per_call).map(batch)

    ds = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(to_block, num_parallel_calls=1).flat_map(batches)
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options).prefetch(prefetch)
    if device == "auto":
        device = "/GPU:0" if tf.config.list_physical_devices("GPU") else None
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=prefetch))
    ds._replaystore_prefetcher = prefetcher  # keeps the workers alive with the dataset; close() stops them
    return ds
