"""Decode processes: the prefetcher's blocks decoded and gathered by child processes into shared
memory must hold exactly what decoding on its threads gives, whatever the chunks hold (frames in the
shard the writer holds in RAM, empty chunks, payloads that cannot be joined), and failures must surface as
they do on threads: a bad chunk named, a dead worker replaced by the threads, workers ended on close."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import fill_truth, make_store, rewrite_obs_shard
from groundtruth import check_stack, step

from replaystore import ChunkChecksumError, ReplayStore, SampleError
from replaystore.feed import decodeprocs
from replaystore.feed.prefetch import BLOCKS_IN_USE, Prefetcher

pytestmark = pytest.mark.skipif(decodeprocs.LIBZSTD is None or not hasattr(os, "memfd_create"),
                                reason="decode processes need Linux's memfd and libzstd")

CHUNK_LEN = 4


@pytest.fixture
def filled(store_path: Path) -> ReplayStore:
    """Shards on disk, and the newest steps still in the shard the writer holds in RAM."""
    store = make_store(store_path, capacity=128, frame_stack=3, shard_len=32, chunk_len=CHUNK_LEN)
    fill_truth(store, 200)
    assert store.ring.added % 32, "some steps should still be in the shard the writer holds"
    return store


def draw(store: ReplayStore, processes: bool, blocks: int = 6, **kwargs) -> list[dict[str, np.ndarray]]:
    """The first ``blocks`` blocks of a seeded prefetcher, copied."""
    p = Prefetcher(store, store.sampler(**kwargs), 8, batches_per_block=3, threads=2, depth=3, seed=11,
                   processes=processes)
    try:
        assert (p.processes is not None) == processes
        return [{name: value.copy() for name, value in p.next_block().items()} for _ in range(blocks)]
    finally:
        p.close()


def assert_same(ours: list[dict[str, np.ndarray]], theirs: list[dict[str, np.ndarray]]) -> None:
    for mine, other in zip(ours, theirs, strict=True):
        assert list(mine) == list(other)
        for name in mine:
            np.testing.assert_array_equal(mine[name], other[name], err_msg=name)


def assert_frames_right(store: ReplayStore, block: dict[str, np.ndarray]) -> None:
    """Every stack of ``block`` against the ground truth: its obs, and its next_obs ``m`` moves on
    (``m`` from the discount: gamma**m, or the episode's end)."""
    obs = block["obs"].reshape(-1, *block["obs"].shape[2:])
    nxt = block["next_obs"].reshape(-1, *block["next_obs"].shape[2:])
    for i in range(obs.shape[0]):
        k, p = check_stack(obs[i], store.frame_stack)
        k2, p2 = check_stack(nxt[i], store.frame_stack)
        assert k2 == k and 1 <= p2 - p <= 3 and block["action"].ravel()[i] == step(k, p).action


@pytest.mark.parametrize("kwargs", [{}, {"n_step": 3, "gamma": 0.9}, {"prioritized": True, "alpha": 0.7}],
                         ids=["uniform", "n-step", "prioritized"])
def test_the_same_blocks_as_on_threads(filled: ReplayStore, kwargs: dict) -> None:
    ours = draw(filled, True, **kwargs)
    assert_same(ours, draw(filled, False, **kwargs))
    for block in ours:
        assert_frames_right(filled, block)


def test_by_default_not_where_frames_are_kept_decoded(filled: ReplayStore) -> None:
    """``processes=None``: decode processes, unless the store keeps its small frames decoded in RAM
    (storage/mirror.py), where a block is copied on the threads."""
    path = filled.path
    assert filled.reader.mirror is not None
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11)
    assert p.processes is None
    p.close()
    filled.close()
    with ReplayStore.open(path, cache_bytes=1000) as store:  # the ring decoded (1,536 bytes) is over half
        assert store.reader.mirror is None
        p = Prefetcher(store, store.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11)
        assert p.processes is not None
        p.close()


def test_empty_chunks_are_zeros(filled: ReplayStore) -> None:
    """A chunk a shard leaves out (zarr's fill value) has no payload and reads as zeros."""
    path = filled.path
    filled.close()
    rewrite_obs_shard(path, 1, CHUNK_LEN, zstandard.ZstdCompressor().compress, rows=16)  # chunks 4-7 left out
    store = ReplayStore.open(path)
    plan = store.reader.plan(np.arange(48, 64, dtype=np.int64))
    store.reader.fetch([plan])
    assert None in plan.payloads
    ours = draw(store, True, blocks=8)
    assert_same(ours, draw(store, False, blocks=8))
    assert any((block["obs"] == 0).all(axis=(3, 4)).any() for block in ours)


def test_payloads_that_cannot_be_joined_are_decoded_one_by_one(filled: ReplayStore) -> None:
    path = filled.path
    filled.close()
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=False)
    rewrite_obs_shard(path, 1, CHUNK_LEN, lambda chunk: compressor.compress(chunk.tobytes()))
    store = ReplayStore.open(path)
    ours = draw(store, True, blocks=8)
    assert_same(ours, draw(store, False, blocks=8))
    for block in ours:
        assert_frames_right(store, block)


def test_a_chunk_that_does_not_decode_is_named(filled: ReplayStore) -> None:
    path = filled.path
    filled.close()
    rewrite_obs_shard(path, 1, CHUNK_LEN, lambda chunk: zstandard.ZstdCompressor().compress(chunk.tobytes()[:-1]))
    store = ReplayStore.open(path)
    with pytest.raises(ChunkChecksumError, match="of shard 1 of 'obs' passed its checksum but does not decompress"):
        draw(store, True, blocks=20)


def test_a_worker_that_dies_is_replaced_by_the_threads(filled: ReplayStore, caplog: pytest.LogCaptureFixture) -> None:
    expected = draw(filled, False, blocks=12)
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11, processes=True)
    got = [{name: value.copy() for name, value in p.next_block().items()} for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="replaystore.feed.decodeprocs"):
        for pid in p.processes.pids():
            os.kill(pid, signal.SIGKILL)
        got += [{name: value.copy() for name, value in p.next_block().items()} for _ in range(10)]
        deadline = time.monotonic() + 30  # the reply threads see the ends on their own time
        while p.processes.alive and time.monotonic() < deadline:
            time.sleep(0.01)
    assert p.processes.alive == 0
    assert "decoded on the prefetcher's threads from now on" in caplog.text
    p.close()
    assert_same(got, expected)


def test_ctrl_c_is_left_to_the_parent(filled: ReplayStore) -> None:
    """SIGINT (Ctrl-C reaches the whole process group) does not stop the workers: the trainer
    checkpoints on it and goes on sampling until it closes the dataset."""
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11, processes=True)
    p.next_block()
    for pid in p.processes.pids():
        assert os.getpgid(pid) == pid  # a group of its own: a terminal's Ctrl-C does not reach it
        deadline = time.monotonic() + 30
        while not int(Path(f"/proc/{pid}/status").read_text().split("SigIgn:")[1].split()[0], 16) & 1 << (signal.SIGINT - 1):
            assert time.monotonic() < deadline, "the worker never set SIGINT aside"
            time.sleep(0.01)
        os.kill(pid, signal.SIGINT)
    got = [{name: value.copy() for name, value in p.next_block().items()} for _ in range(8)]
    assert p.processes.alive == 2 and all(proc.poll() is None for proc in p.processes._procs)
    p.close()
    assert_same(got, draw(filled, False, blocks=9)[1:])


def test_blocks_a_consumer_keeps_are_not_reused(filled: ReplayStore) -> None:
    """With every shared block held, further blocks are made in private memory and decoded on the
    threads; nothing held is overwritten."""
    expected = draw(filled, False, blocks=3 + BLOCKS_IN_USE + 5)
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11, processes=True)
    held = [p.next_block() for _ in range(3 + BLOCKS_IN_USE + 5)]
    assert p.blocks_made > 0
    assert_same(held, expected)
    p.close()


def test_close_ends_the_workers(filled: ReplayStore) -> None:
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=1, processes=True)
    p.next_block()
    procs = list(p.processes._procs)
    p.close()
    assert all(proc.poll() is not None for proc in procs)


def test_queued_requests_are_answered_in_order(filled: ReplayStore) -> None:
    """One worker, two threads sending to it: its second request waits in its pipe, and each reply
    wakes the thread whose block it answers."""
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=1, depth=4, seed=11, processes=True)
    assert len(p.processes.pids()) == 1
    got = [{name: value.copy() for name, value in p.next_block().items()} for _ in range(12)]
    p.close()
    q = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=1, depth=4, seed=11, processes=False)
    expected = [{name: value.copy() for name, value in q.next_block().items()} for _ in range(12)]
    q.close()
    assert_same(got, expected)


def test_workers_end_when_the_prefetcher_is_dropped(filled: ReplayStore) -> None:
    """The reply threads do not keep the workers alive: dropping an unclosed prefetcher ends them."""
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=1, processes=True)
    p.next_block()
    procs = list(p.processes._procs)
    p._pool.shutdown(wait=True)  # its threads are idle; what is left to drop is the prefetcher itself
    del p
    gc.collect()
    for proc in procs:
        proc.wait(timeout=30)


HANGS = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read(24)  # takes a request's frame, then never answers
time.sleep(3600)
"""
GARBAGE = """
import os, sys
sys.stdin.buffer.read(24)
sys.stdout.buffer.write(os.urandom(16))  # not a reply to anything
sys.stdout.buffer.flush()
sys.stdin.buffer.read()
"""


@pytest.mark.parametrize("script", [HANGS, GARBAGE], ids=["hangs", "writes-garbage"])
def test_a_worker_that_misbehaves_is_killed_and_the_threads_take_over(
        filled: ReplayStore, script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    monkeypatch.setattr(decodeprocs, "WORKER", worker)
    monkeypatch.setattr(decodeprocs, "REPLY_TIMEOUT", 1.0)
    expected = draw(filled, False, blocks=6)
    with caplog.at_level(logging.WARNING, logger="replaystore.feed.decodeprocs"):
        p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11, processes=True)
        procs = list(p.processes._procs)
        got = [{name: value.copy() for name, value in p.next_block().items()} for _ in range(6)]
        started = time.monotonic()
        p.close()
    assert time.monotonic() - started < 60  # (only catches a hang: close waits 1 s a worker at most)
    assert_same(got, expected)
    assert "killed" in caplog.text and "decoded on the prefetcher's threads" in caplog.text
    assert all(proc.poll() is not None for proc in procs)


def test_a_hung_worker_does_not_hang_close(filled: ReplayStore, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(HANGS)
    monkeypatch.setattr(decodeprocs, "WORKER", worker)
    monkeypatch.setattr(decodeprocs, "CLOSE_TIMEOUT", 1.0)
    p = Prefetcher(filled, filled.sampler(), 8, batches_per_block=3, threads=2, depth=3, seed=11, processes=True)
    procs = list(p.processes._procs)
    p._inflight.append(p._pool.submit(p._draw, 0))  # a block sent to a worker that will never answer
    time.sleep(0.5)
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 60  # (only catches a hang: close waits 1 s a worker at most)
    assert all(proc.poll() is not None for proc in procs)


def test_where_processes_cannot_run(filled: ReplayStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decodeprocs, "LIBZSTD", None)
    with pytest.raises(SampleError, match="no libzstd shared library.*processes=False"):
        Prefetcher(filled, filled.sampler(), 8, processes=True)
    p = Prefetcher(filled, filled.sampler(), 8, processes=None)  # where available: here, threads
    assert p.processes is None
    p.close()
