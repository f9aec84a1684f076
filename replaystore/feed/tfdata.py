"""``ReplayStore.as_dataset``: sampled batches as a ``tf.data.Dataset``. The one module that imports
TensorFlow (``import replaystore`` does not).

The bridge from Python is the cost to beat: measured here, ``from_generator`` delivered ~400 batches/s
and a ``numpy_function`` per batch ~800/s, against thousands a second from the sampler. So each
``numpy_function`` call hands over a whole *block* of batches drawn ahead by ``prefetch.Prefetcher``
in the background (worker threads, and decode processes where available), and the block is cut
into batches inside TensorFlow without copying:

- a block's ``obs`` and ``next_obs`` are ``(k, batch, stack, ...)`` arrays aligned to 64 bytes:
  TensorFlow wraps an aligned numpy array as it is, while numpy's usual 16-byte alignment made it
  copy every block (measured on the bridge alone: 5,064 batches/s unaligned, 10,937 aligned);
- ``from_tensor_slices`` cuts a block into its k batches. Its slices share the block's memory
  when they start on a 64-byte boundary (Atari batches do; odd shapes are copied), and it runs no
  function per batch: a ``map`` over ``range(k)`` per block ran a graph function for every batch,
  whose hand-offs between TensorFlow's threads cost ~70 us of CPU a batch;
- no ``tf.data`` prefetch: the workers already keep ``prefetch`` batches ready, so the consumer's
  own thread takes a block (one ``numpy_function`` call) and slices it, with no hand-over between
  threads;
- the workers gather each batch straight into the block (no copy) and recycle a block once no
  tensor refers to it any more (the tensors hold a reference to the arrays handed over);
- a Python loop's ``next()`` goes through ``BatchIterator``: TensorFlow's stock ``next()`` spent
  ~45 of its ~70 us a batch (9 tensors) in Python, with the GIL held, re-checking shapes and
  rebuilding the dict, and that beside the workers was what kept a Python loop at 0.65-0.8x the
  sampler's rate.

Bridge alone (pre-drawn blocks, 32 a call, empty Python loop): ~150 us of CPU a batch with a graph
function per batch and a prefetch thread, ~90 us without them, ~37 us with ``BatchIterator``
(~30,000 batches/s). With the workers decoding on threads, an empty Python loop got 0.87-0.96x the
sampler's own rate with one worker but only 0.74-0.77x with two, the same as a loop inside a
``tf.function``: on two cores the two worker threads spent a quarter of their time waiting for the
GIL beside a consumer. So by default the workers' decoding and gathering run in decode processes
(decodeprocs.py) that write into block memory shared with this process; tools/bench_sampling.py
has the side-by-side numbers, and the README the latest.

Each element is a dict with the fields of ``Batch``; ``index`` and ``weight`` ride along so a learner
can call ``store.update_priorities(batch["index"], new_priorities)``.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_dataset_ops

from replaystore.errors import SampleError
from replaystore.feed.prefetch import FIELDS, Prefetcher

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
               seed: int | None = None, device: str | None = "auto", processes: bool | None = None) -> tf.data.Dataset:
    """See ``ReplayStore.as_dataset``."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise SampleError(f"prefetch is {prefetch!r}; it must be a positive int (batches kept ready)")
    prefetcher = Prefetcher(store, batch_size, batches_per_block=batches_per_call, threads=threads,
                            depth=max(2, -(-prefetch // batches_per_call) + threads), seed=seed, n_step=n_step,
                            gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta, processes=processes)
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
    return ReplayDataset(ds, prefetcher)


class ReplayDataset(tf.data.Dataset):
    """What ``as_dataset`` returns: the pipeline built there, as a ``tf.data.Dataset`` like any other
    (the same graph: ``map``, ``take``, ``with_options``, Keras's ``fit`` and ``tf.function`` see a
    plain dataset). It keeps the ``prefetcher`` whose workers feed it (``prefetcher.close()`` stops
    them), and a Python loop over it iterates through ``BatchIterator``."""

    def __init__(self, pipeline: tf.data.Dataset, prefetcher: Prefetcher) -> None:
        self._pipeline = pipeline
        self.prefetcher = prefetcher
        super().__init__(pipeline._variant_tensor)  # the pipeline's own graph: nothing is added to it

    def _inputs(self) -> list[tf.data.Dataset]:
        return [self._pipeline]

    @property
    def element_spec(self) -> dict[str, tf.TensorSpec]:
        return self._pipeline.element_spec

    def __iter__(self) -> iterator_ops.OwnedIterator:
        if not context.executing_eagerly():
            return super().__iter__()
        return BatchIterator(self)


class BatchIterator(iterator_ops.OwnedIterator):
    """TensorFlow's own iterator, handing out each batch's dict directly.

    The stock ``next()`` runs tf.data's generic structure code on every element: it rebuilds the
    dict through ``nest`` and calls ``set_shape`` on each of the 9 tensors, which for an eager
    tensor only checks in Python a shape the graph has already fixed (``ensure_shape`` and
    ``from_tensor_slices`` above). Measured on a bare ``from_tensors(...).repeat()`` of such dicts:
    ~67 us a ``next()``, against ~24 us for the op alone and ~17 us with its attributes passed as
    plain lists. All of it holds the GIL the sampling workers need. The op and everything else are
    the stock iterator's (an error while sampling raises from this ``next()``); inside a
    ``tf.function``, or where eager execution was made asynchronous, the stock ``next()`` runs.
    """

    def __init__(self, dataset: ReplayDataset) -> None:
        super().__init__(dataset)
        self._names = list(dataset.element_spec)  # the element_spec's order, as the stock iterator gives
        flat = tf.nest.flatten({name: i for i, name in enumerate(self._names)})  # the order tf.data flattens in
        self._pick = operator.itemgetter(*[flat.index(i) for i in range(len(flat))])
        # the op's attributes as plain ints and lists, which the eager fast path reads ~7 us a call
        # quicker than DType and TensorShape objects (the shapes are all fully known here)
        self._types = [dtype.as_datatype_enum for dtype in self._flat_output_types]
        self._shapes = [shape.as_list() for shape in self._flat_output_shapes]
        # The stock next() runs the op under a fresh synchronous executor, so that an error (the end
        # of the data) raises in next() even when eager execution is asynchronous. Eager execution
        # is synchronous unless asked otherwise, and that scope's executor calls release and retake
        # the GIL: without it the consumer used ~35-40 against ~45-55 us of CPU a batch beside two
        # workers, with fewer thread switches. So the stock next() runs only where it matters.
        self._stock = context.context().is_async()

    def _next_internal(self) -> dict[str, tf.Tensor]:
        if self._stock or not context.executing_eagerly():
            return super()._next_internal()
        flat = gen_dataset_ops.iterator_get_next(self._iterator_resource, output_types=self._types,
                                                 output_shapes=self._shapes)
        return dict(zip(self._names, self._pick(flat)))
