"""Crash safety: a child appending transitions is SIGKILLed at random moments, again and again.

After every kill the store must verify clean, open, hold every transition it had committed (the child logs each
commit), have every live step's frame and move (its extras too) exactly as written, and sample correctly; then a new
child continues it, so kills land in every phase (mid-shard, at a shard boundary, while wrapping).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import frame
from crash_child import CAPACITY, SHAPE, move

from replaystore import ReplayStore
from replaystore.cli.verify import verify_store

CHILD = Path(__file__).parent / "crash_child.py"


def check_store(path: Path, committed_at_least: int) -> int:
    report = verify_store(path)
    assert report.ok, [p.message for p in report.problems]
    store = ReplayStore.open(path)
    ring = store.ring
    assert store.committed.added >= committed_at_least, "a committed transition was lost"
    positions = np.arange(ring.lo, ring.added, dtype=np.int64)
    frames = store.reader.gather(positions)
    for p, f in zip(positions.tolist(), frames):
        np.testing.assert_array_equal(f, frame(p, SHAPE), err_msg=f"frame of step {p} is wrong after a crash")
    for p in positions[:-1].tolist():
        s = p % ring.capacity
        if not ring.is_last[s]:
            assert (ring.action[s], ring.reward[s], ring.terminated[s], ring.truncated[s]) == move(p)
            assert ring.fields["extras/h"][s] == p and ring.fields["extras/half"][s].tolist() == [p / 2, -p / 2]
        else:
            assert ring.fields["extras/h"][s] == 0
    if len(store) >= 8:
        batch = store.sample(8, rng=np.random.default_rng(0))
        for i, slot in enumerate(batch.index.tolist()):
            p = int(positions[positions % ring.capacity == slot][0])
            np.testing.assert_array_equal(batch.obs[i][-1], frame(p, SHAPE))
            np.testing.assert_array_equal(batch.next_obs[i][-1], frame(p + 1, SHAPE))
            assert batch.extras["h"][i] == p
    added = store.committed.added
    store.close()
    return added


def kill_rounds(tmp_path: Path, rounds: int, seed: int) -> None:
    path, log = tmp_path / "r.zarr", tmp_path / "commits.log"
    rng = np.random.default_rng(seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    live_kills = 0  # kills that hit a child still writing, after it had committed something itself
    for i in range(rounds):
        child = subprocess.Popen([sys.executable, str(CHILD), str(path), str(log), str(i)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready = select.select([child.stdout], [], [], 60)[0] and child.stdout.readline() == b"writing\n"
        assert ready, child.stderr.read().decode() if child.poll() is not None else "the child never started writing"
        time.sleep(float(rng.uniform(0.0, 0.4)))
        live_kills += child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait()
        logged = [int(x) for x in log.read_text().split()] if log.exists() else [0]
        check_store(path, max(logged, default=0))
    assert live_kills >= rounds * 0.9, f"only {live_kills} of {rounds} kills landed on a writing child"
    final = ReplayStore.open(path)
    assert final.committed.added > final.capacity, "the ring never wrapped during the crash test"
    final.close()


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    kill_rounds(tmp_path, rounds=12, seed=1)  # (100 in the slow run's test below)


@pytest.mark.slow
def test_sigkill_at_many_random_moments(tmp_path: Path) -> None:
    kill_rounds(tmp_path, rounds=100, seed=2)


def test_a_reader_during_writing_sees_a_consistent_store(tmp_path: Path) -> None:
    """A writer appends and wraps a small ring as fast as it can; readers opened at random moments
    keep reading for a while. Each must see exactly the steps of the commit it opened at."""
    path, log = tmp_path / "r.zarr", tmp_path / "commits.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, str(CHILD), str(path), str(log), "5"], env=env, stderr=subprocess.PIPE)
    rng = np.random.default_rng(3)
    readers = 0
    try:
        deadline = time.monotonic() + 20
        while not (path / "zarr.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        hang = time.monotonic() + 300  # (only catches a hang: the loop ends on counts)
        while readers < 25 or committed(path) <= 4 * CAPACITY:  # 25 readers, and the writer wrapped its ring 4 times
            assert time.monotonic() < hang, f"{readers} readers and {committed(path)} steps in 300 s"
            store = ReplayStore.open(path)
            time.sleep(float(rng.uniform(0, 0.05)))  # the writer moves on, and wraps, meanwhile
            ring = store.ring
            positions = np.arange(ring.lo, ring.added, dtype=np.int64)
            frames = store.reader.gather(positions)
            for p, f in zip(positions.tolist(), frames):
                np.testing.assert_array_equal(f, frame(p, SHAPE), err_msg=f"reader saw a newer frame at step {p}")
            if len(store) >= 8:
                batch = store.sample(8, rng=rng)
                for i, slot in enumerate(batch.index.tolist()):
                    p = int(positions[positions % ring.capacity == slot][0])
                    np.testing.assert_array_equal(batch.next_obs[i][-1], frame(p + 1, SHAPE))
                    assert batch.extras["h"][i] == p
            store.close()
            readers += 1
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else "writer exited"
    finally:
        child.kill()
        child.wait()


def committed(path: Path) -> int:
    """The steps the store at ``path`` has committed."""
    with ReplayStore.open(path) as store:
        return store.committed.added
