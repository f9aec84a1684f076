"""``store.blocks`` (numpy) and ``store.jax_blocks`` (on a JAX device): contents equal to the store's
own transitions, the same blocks for the same seed as ``as_dataset`` cuts into batches, memory kept
intact while a consumer holds a block, and a feeder that stops cleanly and reports its errors."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import fill_truth, make_store
from groundtruth import check_stack, step

from replaystore import BlockReleasedError, ReplayStore, SampleError
from replaystore.feed.block import Block

FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated", "discount", "index", "weight")


@pytest.fixture
def filled(store_path: Path) -> ReplayStore:
    store = make_store(store_path, capacity=128, frame_stack=3, shard_len=32, chunk_len=4)
    fill_truth(store, 196)
    store.flush()
    return store


def check_block(block: Block | dict[str, np.ndarray]) -> None:
    """Every transition of ``block`` against the ground truth (1-step: next_obs is one move on)."""
    for i in range(block["obs"].shape[0]):
        for j in range(block["obs"].shape[1]):
            k, p = check_stack(block["obs"][i, j], 3)
            assert check_stack(block["next_obs"][i, j], 3) == (k, p + 1)
            assert block["action"][i, j] == step(k, p).action


def test_blocks_hold_the_stores_transitions(filled: ReplayStore) -> None:
    with filled.blocks(16, batches_per_block=4, seed=1, threads=2) as it:
        for _ in range(5):
            block = next(it)
            assert set(block) == set(FIELDS)
            assert block["obs"].shape == (4, 16, 3, 3, 4) and block["reward"].shape == (4, 16)
            check_block(block)


def test_a_released_block_is_an_error_and_its_arrays_stay_intact(filled: ReplayStore) -> None:
    """``release()`` hands a block's memory back at once: the block's fields raise from then on,
    arrays taken from it keep their values however far iteration goes, and released blocks are
    recycled although the consumer keeps the block objects."""
    with filled.blocks(16, batches_per_block=2, seed=6, threads=2, depth=2) as it:
        kept_blocks, kept_arrays = [], []
        for n in range(80):
            block = next(it)
            if n % 20 == 0:
                kept_arrays.append({name: block[name] for name in ("obs", "next_obs", "action")})
            block.release()
            kept_blocks.append(block)  # released: holding the object holds no memory
        # without recycling 80; with it, the pool's pieces, the blocks whose arrays are kept, and a
        # fresh block or two per thread while the pool's are all in use
        made, bound = it.prefetcher.blocks_made, it.prefetcher.pool.limit + len(kept_arrays) + 4
        assert made <= bound, f"released blocks are not being recycled: {made} blocks made for 80"
        with pytest.raises(BlockReleasedError, match="released"):
            kept_blocks[-1]["obs"]
        with pytest.raises(BlockReleasedError):
            dict(kept_blocks[0])
        for arrays in kept_arrays:
            check_block(arrays)
        with next(it) as block:
            check_block(block)
        assert block.released


def test_blocks_are_as_datasets_batches(filled: ReplayStore) -> None:
    tf = pytest.importorskip("tensorflow")
    del tf
    with filled.blocks(8, batches_per_block=3, seed=4, n_step=2, threads=1) as it:
        blocks = [next(it) for _ in range(3)]
    ds = filled.as_dataset(8, seed=4, n_step=2, threads=2, batches_per_call=3)
    batches = list(ds.take(9))
    ds.prefetcher.close()
    for j, batch in enumerate(batches):
        for name in FIELDS:
            np.testing.assert_array_equal(batch[name].numpy(), blocks[j // 3][name][j % 3], err_msg=name)
    ds = filled.as_dataset(8, seed=4, n_step=2, threads=2, batches_per_call=3, blocks=True)  # whole blocks
    assert ds.element_spec["obs"].shape == (3, 8, *blocks[0]["obs"].shape[2:])
    for got, block in zip(ds.take(3), blocks, strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(got[name].numpy(), block[name], err_msg=name)
    ds.prefetcher.close()


def test_held_blocks_stay_intact_while_others_are_recycled(filled: ReplayStore) -> None:
    with filled.blocks(16, batches_per_block=2, seed=2, threads=2, depth=2) as it:
        for _ in range(60):
            next(it)
        assert it.prefetcher.blocks_made <= 8, "blocks are not being recycled"
        held = [next(it) for _ in range(6)]
        copies = [{name: block[name].copy() for name in ("obs", "next_obs")} for block in held]
        view = held[0]["obs"][1]  # a view alone keeps its block
        view_copy = view.copy()
        del held[0]
        for _ in range(60):
            next(it)
        for block, copy in zip(held, copies[1:], strict=True):
            for name in copy:
                np.testing.assert_array_equal(block[name], copy[name])
            check_block(block)
        np.testing.assert_array_equal(view, view_copy)


def test_a_feed_keeps_the_store_it_draws_from_open(filled: ReplayStore, store_path: Path) -> None:
    """``ReplayStore.open(path).blocks(...)`` with nothing else holding the store: the feed holds its
    parts (store/parts.py), so they stay open while it runs and close when it is gone."""
    import gc
    import weakref

    filled.close()
    store = ReplayStore.open(store_path)
    parts = weakref.ref(store._parts)
    it = store.blocks(8, batches_per_block=2, seed=0)
    del store
    gc.collect()
    with it:
        for _ in range(3):
            check_block(next(it))
    assert parts() is not None and not parts().closed  # type: ignore[union-attr]
    del it
    gc.collect()
    assert parts() is None  # (and its finalizer closed the reader and the backend)


def test_blocks_bad_arguments(filled: ReplayStore) -> None:
    with pytest.raises(SampleError, match="batches_per_block"):
        filled.blocks(8, batches_per_block=0)
    with pytest.raises(SampleError, match="n_step"):
        filled.blocks(8, n_step=0)


jax = pytest.importorskip("jax")


def test_jax_blocks_equal_the_numpy_blocks(filled: ReplayStore) -> None:
    with filled.blocks(16, batches_per_block=4, seed=3, threads=1) as it:
        host = [next(it) for _ in range(4)]
    with filled.jax_blocks(16, batches_per_block=4, seed=3, threads=2, depth=2) as feed:
        dev = [next(feed) for _ in range(4)]
    for h, d in zip(host, dev, strict=True):
        for name in FIELDS:
            if name == "index":  # host bookkeeping, for update_priorities
                assert isinstance(d[name], np.ndarray) and d[name].dtype == np.int64
            else:
                assert isinstance(d[name], jax.Array) and d[name].devices() == {jax.devices()[0]}
            assert d[name].shape == h[name].shape
            np.testing.assert_array_equal(np.asarray(d[name]), h[name], err_msg=name)


def test_jax_blocks_held_by_the_learner_stay_intact(filled: ReplayStore) -> None:
    """On the CPU backend device_put may alias the block's memory: a device block the learner keeps
    must not change while the feeder and the prefetcher go on and recycle others."""
    with filled.jax_blocks(16, batches_per_block=2, seed=5, threads=2, depth=2) as feed:
        held = [next(feed) for _ in range(4)]
        copies = [np.asarray(b["obs"]).copy() for b in held]
        for _ in range(60):
            next(feed)
        for block, copy in zip(held, copies, strict=True):
            np.testing.assert_array_equal(np.asarray(block["obs"]), copy)
        # without recycling ~64; with it, the pool's pieces, the blocks held, and a fresh block or two
        # per thread while the pool's are all in use
        made, bound = feed.prefetcher.blocks_made, feed.prefetcher.pool.limit + len(held) + 4
        assert made <= bound, f"blocks are not being recycled: {made} made for 64"


def test_jax_feeder_runs_ahead_and_stops(filled: ReplayStore) -> None:
    others = set(threading.enumerate())  # (another test's workers may not have been collected yet)
    feed = filled.jax_blocks(8, batches_per_block=2, seed=0, threads=1, depth=3)
    next(feed)
    deadline = time.monotonic() + 30
    while feed._queue.qsize() < 3 and time.monotonic() < deadline:  # it fills its depth without being asked
        time.sleep(0.01)
    assert feed._queue.qsize() == 3
    feed.close()
    assert not feed._thread.is_alive()
    assert not any(t.name.startswith("replaystore-sample") for t in set(threading.enumerate()) - others)
    with pytest.raises(SampleError, match="closed"):
        next(feed)


def test_jax_feeder_reports_its_errors(filled: ReplayStore) -> None:
    feed = filled.jax_blocks(8, batches_per_block=2, seed=0, threads=1, depth=1)
    next(feed)
    filled.close()  # the store goes away under the feeder
    with pytest.raises(SampleError, match="device feeder failed"):
        for _ in range(10):
            next(feed)
    feed.close()
