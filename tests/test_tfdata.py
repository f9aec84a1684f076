"""``as_dataset``: element_spec, batches identical to the store's own frames, determinism, prioritized
replay through the pipeline, and adding to the store while the pipeline samples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fill_truth, make_store
from groundtruth import check_stack, step

from replaystore import ReplayStore, SampleError

tf = pytest.importorskip("tensorflow")


def check_batch(batch: dict, n_step: int = 1) -> None:
    """A batch's stacks, next stacks and moves against the ground truth (frames spell their step)."""
    obs, nxt, action = batch["obs"].numpy(), batch["next_obs"].numpy(), batch["action"].numpy()
    for i in range(obs.shape[0]):
        k, p = check_stack(obs[i], 3)
        assert check_stack(nxt[i], 3) == (k, p + 1) and action[i] == step(k, p).action


@pytest.fixture
def filled(store_path: Path) -> ReplayStore:
    store = make_store(store_path, capacity=128, frame_stack=3, shard_len=32, chunk_len=4)
    fill_truth(store, 196)
    store.flush()
    return store


def test_element_spec_and_contents(filled: ReplayStore) -> None:
    ds = filled.as_dataset(16, seed=1, batches_per_call=3, threads=2, prefetch=4)
    spec = ds.element_spec
    assert spec["obs"].shape == (16, 3, 3, 4) and spec["obs"].dtype == tf.uint8
    assert spec["next_obs"].shape == (16, 3, 3, 4)
    assert {k: spec[k].dtype for k in ("action", "index")} == {"action": tf.int64, "index": tf.int64}
    assert spec["weight"].shape == (16,) and spec["terminated"].dtype == tf.bool
    for batch in ds.take(7):
        check_batch(batch)
        np.testing.assert_array_equal(batch["weight"].numpy(), np.ones(16, np.float32))


@pytest.mark.parametrize("batch_size", [16, 7], ids=["aligned-slices", "unaligned-slices"])
def test_batches_held_by_the_consumer_stay_intact(filled: ReplayStore, batch_size: int) -> None:
    """Frame blocks are handed to TensorFlow without a copy and recycled: a block must not be reused
    while any tensor (or numpy view of one) from it is alive, however far iteration goes on."""
    ds = filled.as_dataset(batch_size, seed=2, threads=2, batches_per_call=2, prefetch=2)
    it = iter(ds)
    for _ in range(100):  # a consumer that lets go of its batches: a few blocks, recycled
        next(it)
    assert ds.prefetcher.blocks_made <= 8, "frame blocks are not being recycled"
    held = [next(it) for _ in range(12)]
    views = [(b["obs"].numpy(), b["next_obs"].numpy()) for b in held[:4]]
    for _ in range(120):  # many times the blocks in flight: free blocks are reused meanwhile
        next(it)
    for batch in held:
        check_batch(batch)
    for obs, nxt in views:  # numpy views of the tensors, kept without their tensors
        for i in range(obs.shape[0]):
            k, p = check_stack(obs[i], 3)
            assert check_stack(nxt[i], 3) == (k, p + 1)


def test_batches_share_the_prefetched_memory(filled: ReplayStore) -> None:
    """With 64-byte aligned batch slices TensorFlow copies nothing: a batch's tensors show what is
    written to the prefetcher's block memory afterwards (a copy anywhere in the pipeline would not)."""
    ds = filled.as_dataset(16, seed=3, threads=1, batches_per_call=4, prefetch=4)  # 16 * 3 * 3 * 4 = 9 * 64 bytes
    it = iter(ds)
    held = [next(it) for _ in range(6)]  # from two blocks
    for piece in ds.prefetcher.pool.memory:
        np.frombuffer(piece, np.uint8)[...] = 255
    for batch in held:
        assert (batch["obs"].numpy() == 255).all() and (batch["next_obs"].numpy() == 255).all()
    ds.prefetcher.close()


def test_python_iterator_matches_tensorflows_own(filled: ReplayStore) -> None:
    """A Python loop over the dataset gets its dicts from ``BatchIterator``; anything built on the
    dataset (here ``take``) and a ``tf.function`` go through TensorFlow's stock iterator. Both must
    give the same batches, with the element_spec's keys, dtypes and static shapes."""
    ds = filled.as_dataset(16, seed=7, n_step=3, threads=2, batches_per_call=3)
    assert isinstance(ds, tf.data.Dataset)
    spec = ds.element_spec
    ours = [next(iter_) for iter_ in [iter(ds)] for _ in range(7)]
    stock = list(filled.as_dataset(16, seed=7, n_step=3, threads=1, batches_per_call=3).take(7))
    for mine, theirs in zip(ours, stock, strict=True):
        assert list(mine) == list(theirs) and set(mine) == set(spec)
        for name, tensor in mine.items():
            assert tensor.shape == spec[name].shape and tensor.dtype == spec[name].dtype, name
            np.testing.assert_array_equal(tensor.numpy(), theirs[name].numpy(), err_msg=name)

    it = iter(filled.as_dataset(16, seed=7, n_step=3, threads=1, batches_per_call=3))
    in_graph = tf.function(lambda: next(it)["reward"])  # the iterator as a tf.function captures it
    np.testing.assert_array_equal(in_graph().numpy(), stock[0]["reward"].numpy())
    np.testing.assert_array_equal(next(it)["reward"].numpy(), stock[1]["reward"].numpy())


def test_asynchronous_eager_execution_gets_the_same_batches(filled: ReplayStore) -> None:
    """Where eager execution is asynchronous the iterator keeps TensorFlow's stock ``next()``."""
    stock = list(filled.as_dataset(8, seed=9, threads=1, batches_per_call=2).take(3))
    tf.config.experimental.set_synchronous_execution(False)
    try:
        it = iter(filled.as_dataset(8, seed=9, threads=1, batches_per_call=2))
        assert it._stock
        ours = [next(it) for _ in range(3)]
        for mine, theirs in zip(ours, stock, strict=True):
            for name in theirs:
                np.testing.assert_array_equal(mine[name].numpy(), theirs[name].numpy(), err_msg=name)
    finally:
        tf.config.experimental.set_synchronous_execution(True)
    assert not iter(filled.as_dataset(8, seed=9, threads=1))._stock


def test_same_seed_same_batches(filled: ReplayStore) -> None:
    def first(seed: int, threads: int) -> list[np.ndarray]:
        ds = filled.as_dataset(8, seed=seed, n_step=2, threads=threads, batches_per_call=2)
        return [np.concatenate([b["obs"].numpy().ravel(), b["reward"].numpy().view(np.uint8)]) for b in ds.take(9)]

    a, b, c = first(5, 1), first(5, 2), first(6, 2)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_prioritized_through_the_pipeline(filled: ReplayStore) -> None:
    ds = filled.as_dataset(32, prioritized=True, alpha=1.0, beta=0.5, seed=0, batches_per_call=1, prefetch=1, threads=1)
    it = iter(ds)
    batch = next(it)
    hot = int(batch["index"].numpy()[0])
    filled.update_priorities(batch["index"].numpy(), np.full(32, 1e-3))
    filled.update_priorities(np.array([hot]), np.array([1e4]))
    later = [next(it) for _ in range(8)][-3:]  # the first few were drawn before the update
    share = np.mean([np.mean(b["index"].numpy() == hot) for b in later])
    assert share > 0.8
    w = later[-1]["weight"].numpy()
    assert w.max() <= 1.0 and w.min() > 0


def test_adding_while_the_pipeline_samples(filled: ReplayStore) -> None:
    it = iter(filled.as_dataset(16, seed=3, threads=2, batches_per_call=2))
    for _ in range(6):
        fill_truth(filled, 70, start=filled.ring.added - 1)  # the stream goes on, and wraps the 128-step ring
        check_batch(next(it))
    check_batch(next(iter(filled.as_dataset(16, seed=4, threads=1, batches_per_call=1, prefetch=1))))


def test_bad_arguments(filled: ReplayStore) -> None:
    with pytest.raises(SampleError, match="batch_size"):
        filled.as_dataset(0)
    with pytest.raises(SampleError, match="asked for 500"):
        filled.as_dataset(500)
    with pytest.raises(SampleError, match="prefetch"):
        filled.as_dataset(8, prefetch=0)


def test_importing_replaystore_does_not_import_tensorflow() -> None:
    code = "import sys, replaystore, replaystore.cli; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
