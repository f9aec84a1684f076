"""``ReplayStore.as_dataset``: sampled batches as a ``tf.data.Dataset``. The one module that imports
TensorFlow (``import replaystore`` does not).

The bridge from Python is the cost to beat: measured here, ``from_generator`` delivered ~400 batches/s
and a ``numpy_function`` per batch ~800/s, against thousands a second from the sampler. So each
``numpy_function`` call hands over a whole *block* of batches drawn ahead by ``prefetch.Prefetcher``
on background threads, and the block is cut into batches inside TensorFlow without copying:

- a block's ``obs`` and ``next_obs`` are ``(k, batch, stack, ...)`` arrays aligned to 64 bytes:
  TensorFlow wraps an aligned numpy array as it is, while numpy's usual 16-byte alignment made it
  copy every block (measured on the bridge alone: 5,064 batches/s unaligned, 10,937 aligned);
- ``from_tensor_slices`` cuts a block into its k batches. Its slices share the block's memory
  when they start on a 64-byte boundary (Atari batches do; odd shapes are copied), and it runs no
  function per batch: a ``map`` over ``range(k)`` per block ran a graph function for every batch,
  whose hand-offs between TensorFlow's threads cost ~70 us of CPU a batch;
- no ``tf.data`` prefetch: the workers already keep ``prefetch`` batches ready, so the consumer's
  own thread takes a block (one ``numpy_function`` call) and slices it, with no hand-over between
  threads. Bridge alone, pre-drawn blocks, 32 a call, empty Python consumer: ~150 -> ~90 us of CPU
  a batch, of which ~75 us is TensorFlow's own ``next()`` (the floor: a ``from_tensors().repeat()``
  dataset costs the same);
- the workers gather each batch straight into the block (no copy) and recycle a block once no
  tensor refers to it any more (the tensors hold a reference to the arrays handed over).

Measured with an empty consumer on the 1M-frame benchmark store (tools/bench_sampling.py has the
side-by-side numbers): a Python ``for`` loop pays ``next()``'s ~75 us with the GIL held, beside the
workers, and gets 0.65-0.8x the sampler's own rate with one worker (0.68 with two); a consumer
inside a ``tf.function`` (Keras's ``fit``, a compiled training step) runs no Python per batch and
gets ~0.9x (0.83 with two).

Each element is a dict with the fields of ``Batch``; ``index`` and ``weight`` ride along so a learner
can call ``store.update_priorities(batch["index"], new_priorities)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from replaystore.errors import SampleError
from replaystore.prefetch import FIELDS, Prefetcher

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
    frame_shape = (batches_per_call, batch_size, store.frame_stack, *store.schema.observation.shape)
    spec = element_spec(store, batch_size)
    out_types = [spec[name].dtype for name in FIELDS]

    def fetch() -> list[np.ndarray]:
        block = prefetcher.next_block()
        return [block[name] for name in FIELDS]

    def to_block(_: tf.Tensor) -> dict[str, tf.Tensor]:
        values = tf.numpy_function(fetch, [], out_types, stateful=True, name="replaystore_sample")
        return {name: tf.ensure_shape(value, frame_shape if name in ("obs", "next_obs") else (batches_per_call, batch_size))
                for name, value in zip(FIELDS, values)}

    # A plain (sequential) map: the consumer's own thread calls ``fetch`` once per block, and the
    # slices of a block are taken on that same thread; no per-batch function and no hand-over
    # between threads (the Prefetcher's workers already keep blocks ready ahead of the consumer).
    ds = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(to_block).flat_map(tf.data.Dataset.from_tensor_slices)
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options)
    if device == "auto":
        device = "/GPU:0" if tf.config.list_physical_devices("GPU") else None
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=prefetch))
    ds._replaystore_prefetcher = prefetcher  # keeps the workers alive with the dataset; close() stops them
    return ds
