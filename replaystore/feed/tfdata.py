"""``ReplayStore.as_dataset``: sampled batches as a ``tf.data.Dataset``. The one module that imports
TensorFlow (``import replaystore`` does not).

The cost to beat is the bridge from Python: a ``numpy_function`` or ``from_generator`` call per
batch costs more than sampling the batch. So each ``numpy_function`` call hands over a whole *block*
of batches drawn ahead by ``prefetch.Prefetcher`` (worker threads, and decode processes where
available), and the block is cut into batches inside TensorFlow without copying:

- a block's ``obs`` and ``next_obs`` are ``(k, batch, stack, ...)`` arrays aligned to 64 bytes,
  which TensorFlow wraps as they are (numpy's usual 16-byte alignment makes it copy);
- ``from_tensor_slices`` cuts a block into its k batches, sharing the block's memory where a slice
  starts on a 64-byte boundary, with no graph function run per batch;
- no ``tf.data`` prefetch stage: the workers already keep ``prefetch`` batches ready, so the
  consumer's own thread takes a block and slices it, with no hand-over between threads;
- blocks are released as soon as their arrays are handed over, and their memory is recycled once no
  tensor refers to it (the tensors hold the arrays; storage/pool.py);
- a Python loop's ``next()`` goes through ``BatchIterator``, which skips the stock iterator's
  per-element Python work (re-checking shapes the graph already fixed) that holds the GIL the
  workers need.

docs/design.md ("Feeding a learner") shows the flow, docs/benchmarks.md the figures. Each element is a
dict with the fields of the sampler's batches (``Batch``, or ``SequenceBatch``); ``index`` and
``weight`` ride along so a learner can call ``store.update_priorities(batch["index"], priorities)``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_dataset_ops

from replaystore.errors import SampleError
from replaystore.feed.prefetch import Prefetcher, Source
from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.nesting import nest
from replaystore.format.schema import Schema
from replaystore.sampling.samplers import Sampler


def element_spec(sampler: Sampler, schema: Schema, batch_size: int,
                 batches: int | None = None) -> dict[str, Any]:
    """The ``element_spec`` of ``as_dataset(batch_size)`` with ``sampler`` over a store of ``schema``;
    with ``batches``, that of whole blocks of that many batches (``blocks=True``). A Dict store's
    observations are dicts of ``TensorSpec``, one per key; the store's extras one dict, ``extras``."""
    lead = () if batches is None else (batches,)
    spec: dict[str, Any] = {}
    for name, (shape, dtype) in sampler.spec(batch_size, schema).items():
        if name.startswith(EXTRAS):  # the store's extras: one dict, as batches give them
            extras = spec.setdefault("extras", {})
            extras[name[len(EXTRAS):]] = tf.TensorSpec((*lead, *shape), tf.as_dtype(dtype), name=f"extras_{len(extras)}")
        elif name in sampler.frames and schema.observation_dict is not None:
            entries = {e.key: tf.TensorSpec((*lead, *shape[:-1], *e.shape), tf.as_dtype(e.dtype), name=f"{name}_{i}")
                       for i, e in enumerate(schema.observation_dict.entries)}
            tree = schema.observation_dict.tree  # (a nested Dict's or a Tuple's: dicts and tuples, as batches give)
            spec[name] = entries if tree is None else nest(tree, list(entries.values()))
        else:
            spec[name] = tf.TensorSpec((*lead, *shape), tf.as_dtype(dtype), name=name)
    return spec


def leaf_paths(spec: Any) -> list[tuple[Any, ...]]:
    """Every tensor of an element, as the keys and tuple positions that lead to it: ``(field,)``, or
    ``(field, key, ...)`` for a Dict store's observations (nested: dicts and tuples) and the extras."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                walk(item, (*path, i))
        else:
            paths.append(path)

    walk(spec, ())
    return paths


def rebuild(spec: Any, values: Iterator[Any]) -> Any:
    """The element's structure (``spec``'s dicts and tuples) holding ``values``, in ``leaf_paths`` order."""
    if isinstance(spec, dict):
        return {key: rebuild(item, values) for key, item in spec.items()}
    if isinstance(spec, tuple):
        return tuple(rebuild(item, values) for item in spec)
    return next(values)


def as_dataset(source: Source, sampler: Sampler, batch_size: int, *, prefetch: int = 4, threads: int = 2,
               batches_per_call: int = 8, seed: int | None = None, device: str | None = "auto",
               processes: bool | None = None, blocks: bool = False) -> tf.data.Dataset:
    """See ``ReplayStore.as_dataset``."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise SampleError(f"prefetch is {prefetch!r}; it must be a positive int (batches kept ready)")
    prefetcher = Prefetcher(source, sampler, batch_size, batches_per_block=batches_per_call, threads=threads,
                            depth=max(2, -(-prefetch // batches_per_call) + threads), seed=seed, processes=processes)
    block_spec = element_spec(sampler, source.schema, batch_size, batches_per_call)
    paths = leaf_paths(block_spec)
    leaves = [_at(block_spec, path) for path in paths]
    out_types = [leaf.dtype for leaf in leaves]

    def fetch() -> list[np.ndarray]:
        with prefetcher.next_block() as block:  # released once handed over: TensorFlow holds the arrays
            return [_at(block, path) for path in paths]

    def to_block(_: tf.Tensor) -> dict[str, Any]:
        values = tf.numpy_function(fetch, [], out_types, stateful=True, name="replaystore_sample")
        return rebuild(block_spec, iter([tf.ensure_shape(value, leaf.shape) for value, leaf in zip(values, leaves)]))

    # A plain (sequential) map: the consumer's own thread calls ``fetch`` once per block, and the
    # slices of a block are taken on that same thread; no per-batch function and no hand-over
    # between threads (the Prefetcher's workers already keep blocks ready ahead of the consumer).
    ds = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(to_block)
    if not blocks:
        ds = ds.flat_map(tf.data.Dataset.from_tensor_slices)
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options)
    if device == "auto":
        device = "/GPU:0" if tf.config.list_physical_devices("GPU") else None
    if device is not None:
        ahead = -(-prefetch // batches_per_call) if blocks else prefetch  # (elements, not batches)
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=ahead))
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
    def element_spec(self) -> dict[str, Any]:
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
    ``from_tensor_slices`` above), all with the GIL held that the sampling workers need; that work
    costs about three times the op itself (docs/benchmarks.md). The op and everything else are
    the stock iterator's (an error while sampling raises from this ``next()``); inside a
    ``tf.function``, or where eager execution was made asynchronous, the stock ``next()`` runs.
    """

    def __init__(self, dataset: ReplayDataset) -> None:
        super().__init__(dataset)
        spec = dataset.element_spec
        self._paths = leaf_paths(spec)  # the element_spec's order, as the stock iterator gives
        self._names = [path[0] for path in self._paths]
        self._spec = spec
        self._nested = len(self._paths) > len(spec)  # a Dict store's observations, the extras
        flat = tf.nest.flatten(rebuild(spec, iter(range(len(self._paths)))))  # the order tf.data flattens in
        self._pick = operator.itemgetter(*[flat.index(i) for i in range(len(flat))])
        # the op's attributes as plain ints and lists, which the eager fast path reads quicker than
        # DType and TensorShape objects (the shapes are all fully known here)
        self._types = [dtype.as_datatype_enum for dtype in self._flat_output_types]
        self._shapes = [shape.as_list() for shape in self._flat_output_shapes]
        # The stock next() runs the op under a fresh synchronous executor, so that an error (the end
        # of the data) raises in next() even when eager execution is asynchronous. Eager execution
        # is synchronous unless asked otherwise, and that scope's executor calls release and retake
        # the GIL (more CPU a batch and more thread switches). So the stock next() runs only where
        # it matters.
        self._stock = context.context().is_async()

    def _next_internal(self) -> dict[str, Any]:
        if self._stock or not context.executing_eagerly():
            return super()._next_internal()
        flat = gen_dataset_ops.iterator_get_next(self._iterator_resource, output_types=self._types,
                                                 output_shapes=self._shapes)
        if self._nested:
            return rebuild(self._spec, iter(self._pick(flat)))
        return dict(zip(self._names, self._pick(flat)))


def _at(element: Any, path: tuple[Any, ...]) -> Any:
    """The tensor (or array) at ``path`` of an element or a block."""
    for step in path:
        element = element[step]
    return element
