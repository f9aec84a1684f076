"""Descriptors: stores dropped without ``close()`` give theirs back, running out of them is a clear
error, and a store with more shards than it may keep open reads right, also when a prefetcher
block spans them all and a writer rewrites the files a read was planned on (deferred reads)."""

from __future__ import annotations

import gc
import resource
from pathlib import Path

import numpy as np
import pytest
from conftest import OBS_SHAPE, fill, make_store
from test_faults import FRAME, _spaces, add_one, frame_of, open_fds

from replaystore import Layout, ReplayStore
from replaystore.errors import TooManyOpenFilesError


def test_stores_dropped_without_close_give_their_descriptors_back(tmp_path: Path) -> None:
    path = tmp_path / "r.zarr"
    store = make_store(path, capacity=128, shard_len=32, chunk_len=4)  # 4 shard files: 2,400 if they leaked
    fill(store, 250)
    store.close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        gc.collect()
        start = open_fds()
        for _ in range(600):  # (past the limit of 1,024 if each leaked two of its four shard files)
            s = ReplayStore.open(path)
            s.sample(4)
            del s  # never closed
        gc.collect()
        # (none of the stores' stays open; one the process held before may have closed meanwhile:
        # run alone, this file sometimes ends a descriptor short of its start)
        assert open_fds() <= start
        writer = ReplayStore.open(path, mode="a")  # a writer dropped without close: flushed, lock released
        for i in range(250, 255):
            add_one(writer, i, 7)
        added = writer.added
        del writer
        gc.collect()
        assert open_fds() <= start
        with ReplayStore.open(path, mode="a") as again:  # the lock is free again
            assert again.committed.added == added
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_running_out_of_descriptors_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "r.zarr"
    store = make_store(path, capacity=256, shard_len=16, chunk_len=4)
    fill(store, 250)
    store.close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + 3, hard))
        s = ReplayStore.open(path)  # too few descriptors to keep every shard open: opens them lazily
        with pytest.raises(TooManyOpenFilesError, match="too many open files.*close replay stores.*ulimit -n"):
            for _ in range(50):
                s.sample(32)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    s.close()


def test_more_shards_than_open_files_reads_right(tmp_path: Path) -> None:
    """A store with many more shards than it keeps open (and a cache too small to help): files are
    closed and reopened under the batches' feet, and every frame must still be the one written."""
    path = tmp_path / "r.zarr"
    store = ReplayStore.create(path, 512, *_spaces(), frame_stack=2, layout=Layout(shard_len=16, obs_chunk_len=4))
    p = 0
    while store.added < 500:
        store.add(frame_of(p), 0, 0.0, frame_of(p + 1), (p + 1) % 10 == 9, False)
        p += 2 if (p + 1) % 10 == 9 else 1
    store.close()
    reader = ReplayStore.open(path, cache_bytes=64)
    reader.reader.files.close()
    reader.reader.files.max_open = 2  # 32 shards, 2 open at a time: nearly every read reopens a file
    for seed in range(100):
        batch = reader.sample(16, rng=np.random.default_rng(seed))
        for i in range(16):
            at = int(np.frombuffer(batch.obs[i, -1].tobytes()[:FRAME], np.int64)[0])
            np.testing.assert_array_equal(batch.obs[i, -1], frame_of(at))
            np.testing.assert_array_equal(batch.next_obs[i, -1], frame_of(at + 1))
    assert reader.reader.files.open_files <= 2
    reader.close()


def _named(frames: np.ndarray) -> np.ndarray:
    """The step each of ``frames`` (..., *OBS_SHAPE) says it is (see ``frame_of``)."""
    flat = frames.reshape(-1, int(np.prod(OBS_SHAPE)))[:, :FRAME]
    return np.ascontiguousarray(flat).view(np.int64).reshape(frames.shape[: -len(OBS_SHAPE)])


def _wrapping_store(path: Path, capacity: int = 128) -> tuple[ReplayStore, list[int]]:
    """A store of 16-step shards (one chunk of 4 frames each miss) filled past one lap; returns it
    and the next step, in a list, for ``_add``."""
    store = ReplayStore.create(path, capacity, *_spaces(), frame_stack=2, cache_bytes=64,
                               layout=Layout(shard_len=16, obs_chunk_len=4))
    step = [0]
    _add(store, step, capacity + 40)
    return store, step


def _add(store: ReplayStore, step: list[int], n: int) -> None:
    for _ in range(n):
        p = step[0]
        store.add(frame_of(p), p % 5, float(p % 7), frame_of(p + 1), (p + 1) % 10 == 9, False)
        step[0] += 2 if (p + 1) % 10 == 9 else 1


def _check_transitions(batch, frames_from_step=None) -> None:
    """Each transition's newest frame, next frame and scalars belong to one step (the frames name it)."""
    at = _named(batch.obs[:, -1])
    np.testing.assert_array_equal(_named(batch.next_obs[:, -1]), at + 1)
    np.testing.assert_array_equal(batch.action, at % 5)
    np.testing.assert_array_equal(batch.reward, (at % 7).astype(np.float32))


def test_a_block_across_more_shards_than_open_files_holds_no_more_descriptors(tmp_path: Path) -> None:
    """A prefetcher-sized plan (8 batches over every one of 32 shards) with 4 files allowed open:
    the store never holds more than 4 descriptors (a block of 32 Atari batches spans ~1,000 shards,
    and pinning one file per shard ran out of descriptors under the usual limit of 1,024), and every
    frame is the one written."""
    path = tmp_path / "r.zarr"
    store = ReplayStore.create(path, 512, *_spaces(), frame_stack=2, layout=Layout(shard_len=16, obs_chunk_len=4))
    _add(store, [0], 500)
    store.close()
    reader = ReplayStore.open(path, cache_bytes=64)
    files = reader.reader.files
    files.close()
    files.max_open = 4
    before = open_fds()
    for seed in range(6):
        k, n = 8, 32
        out = (np.empty((k, n, 2, *OBS_SHAPE), np.uint8), np.empty((k, n, 2, *OBS_SHAPE), np.uint8))
        pending = reader.plan(reader.sampler(), n, rng=np.random.default_rng(seed), out=list(out), batches=k)
        assert files.open_files <= 4 and open_fds() <= before + 4
        assert any(r.handle is None for plan in pending.plans for _, r in plan.reads), "meant to defer reads"
        batch = pending.finish(reader.reader)
        assert files.open_files <= 4 and open_fds() <= before + 4
        at = _named(batch.obs[:, :, -1])
        np.testing.assert_array_equal(_named(batch.next_obs[:, :, -1]), at + 1)
        np.testing.assert_array_equal(batch.action.reshape(k, n), at % 5)
    reader.close()
    assert open_fds() <= before


def test_a_deferred_read_keeps_the_file_it_was_planned_on_when_the_writer_rewrites_it(tmp_path: Path) -> None:
    """Reads planned (deferred: no descriptor free) before this process's writer renames new files
    over every shard still read the files they were planned on: the frames match the scalars read
    at planning, not the steps written since."""
    store, step = _wrapping_store(tmp_path / "r.zarr")
    files = store.reader.files
    for seed in range(4):
        files.close()
        files.max_open = 0  # every read deferred
        pending = store.plan(store.sampler(), 16, rng=np.random.default_rng(seed))
        assert files._deferred, "meant to defer reads"
        _add(store, step, 128)  # a whole lap: every shard file replaced
        batch = pending.finish(store.reader)
        _check_transitions(batch)
        assert not files._deferred and files.open_files == 0
    store.close()


def test_a_deferred_read_of_a_file_another_writer_replaced_reads_that_files_own_index(tmp_path: Path) -> None:
    """A read-only handle (as in another process: its writer does not tell it) whose deferred reads
    find the shard files replaced reads the chunks at the planned slots from the new files, through
    their own indexes, as a lazily opened reader does: valid frames of those slots, no error."""
    writer, step = _wrapping_store(tmp_path / "r.zarr")
    writer.flush()
    reader = ReplayStore.open(tmp_path / "r.zarr", cache_bytes=64)
    files = reader.reader.files
    files.close()
    files.max_open = 0
    pending = reader.plan(reader.sampler(), 16, rng=np.random.default_rng(0))
    _add(writer, step, 128)
    writer.flush()
    batch = pending.finish(reader.reader)
    at = _named(batch.obs[:, -1])
    np.testing.assert_array_equal(_named(batch.next_obs[:, -1]), at + 1)
    np.testing.assert_array_equal(at % 128, batch.index % 128)  # the planned slots, in their new files
    assert (at > 128 + 40 + 40).any(), "meant to read newer frames"
    reader.close()
    writer.close()
