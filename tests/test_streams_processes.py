"""Writers of a store's streams in other processes: each its own stream, a reader following them
with ``refresh()``, and SIGKILL of one writer at random moments losing nothing of the others."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_streams import small_store

from replaystore import Layout, ReplayStore, StoreLockedError
from replaystore.cli.main import main as cli_main
from replaystore.cli.verify import verify_store
from replaystore.storage.rings import SHIFT


def _writer_proc(path: Path, stream: int, steps: int) -> subprocess.Popen:
    code = f"""
import numpy as np, sys
from replaystore import ReplayStore
s = ReplayStore.open({str(path)!r}, mode="a", streams=[{stream}])
print("ready", flush=True)
sys.stdin.readline()  # "go": the test opens its own handles first
for t in range({steps}):
    s.add(np.full(3, t % 256, np.uint8), t % 3, float({stream}), np.full(3, (t + 1) % 256, np.uint8), False, False)
s.flush()
print("done", flush=True)
sys.stdin.read()
s.close()
"""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_writers_in_other_processes_and_refresh(tmp_path: Path) -> None:
    path = tmp_path / "w.zarr"
    small_store(path, n=3, capacity=3 * 64).close()
    reader = ReplayStore.open(path)
    assert len(reader) == 0 and reader.refresh() == []
    procs = [_writer_proc(path, k, 30 + 10 * k) for k in (0, 2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=f"stream 0 of .* is open for writing by process {procs[0].pid} on host"):
            ReplayStore.open(path, mode="a", streams=[0])
        mine = ReplayStore.open(path, mode="a", streams=[1])  # a third writer, of its own stream
        for p in procs:  # the other writers start only now, so both handles see them move
            p.stdin.write("go\n")
            p.stdin.flush()
        for t in range(5):
            mine.add(np.full(3, t, np.uint8), 0, 1.0, np.full(3, t + 1, np.uint8), False, False)
        mine.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "done"
        assert sorted(reader.refresh()) == [0, 1, 2]
        assert [r.n_valid for r in reader.rings.streams] == [30, 5, 50]
        assert mine.refresh() == [0, 2] and len(mine) == 30 + 5 + 50
        batch = reader.sample(64, rng=np.random.default_rng(0))
        streams = batch.index // reader.rings.stride
        np.testing.assert_array_equal(batch.reward, np.where(streams == 1, 1.0, streams).astype(np.float32))
        np.testing.assert_array_equal(batch.next_obs[:, -1, 0], (batch.obs[:, -1, 0].astype(int) + 1) % 256)
        mine.close()
    finally:
        for p in procs:
            p.communicate("", timeout=60)
    assert verify_store(path).ok
    assert cli_main(["inspect", str(path), "--json"]) == 0



WRITER = """
import sys, time
import numpy as np
from replaystore import ReplayStore
path, k, seed, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = ReplayStore.open(path, mode="a", streams=[k])
ring = s.rings.streams[k]
f = lambda p: np.full(3, (7 * p + k) % 256, np.uint8)
rng = np.random.default_rng([k, seed])
last = s.stream_states()[k].added
print("ready", last, flush=True)
while True:
    p = ring.added
    obs, nxt = (f(p - 1), f(p)) if s.episode_in_progress else (f(p), f(p + 1))
    s.add(obs, p % 3, float(k), nxt, bool(rng.random() < 0.1), False)
    now = s.stream_states()[k].added
    if now != last:
        last = now
        print("committed", now, flush=True)
    time.sleep(pause)
"""


def _start_writer(path: Path, k: int, seed: int = 0, pause: float = 0.0005) -> tuple[subprocess.Popen, list[str]]:
    """A process writing stream ``k``, its episode ends drawn from ``seed`` (each restart its own),
    ``pause`` seconds between moves."""
    import threading

    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(k), str(seed), str(pause)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc, lines


def _check_stream_frames(store: ReplayStore, k: int) -> None:
    ring = store.rings.streams[k]
    positions = np.arange(ring.lo, ring.added, dtype=np.int64)
    got = store.reader.gather((np.int64(k) << SHIFT) | positions)[:, 0]
    np.testing.assert_array_equal(got, ((7 * positions + k) % 256).astype(np.uint8), err_msg=f"stream {k}")
    moves = ~ring.is_last[positions % ring.capacity][:-1]
    np.testing.assert_array_equal(ring.reward[positions[:-1][moves] % ring.capacity], np.float32(k))


def test_killing_one_writer_loses_nothing_of_the_others(tmp_path: Path) -> None:
    """Stream 0's writer is SIGKILLed at random moments (each time after it has committed, the
    handshake) while two other processes write streams 1 and 2 and this process refreshes and
    samples: after every kill every stream verifies, every committed step of stream 0 is there,
    and no sampled transition was ever one that was not committed whole."""

    path = tmp_path / "k.zarr"
    ReplayStore.create(path, 3 * 8192, gym.spaces.Box(0, 255, (3,), np.uint8), gym.spaces.Discrete(3), 2,
                       num_streams=3, layout=Layout(shard_len=32, obs_chunk_len=8)).close()
    # (the other two at a pace that does not lap their 8,192-step rings while stream 0's writer opens
    # the store on a loaded machine: opening reads every stream's scalars, and starts again when a
    # writer has lapped what it read; at 0.5 ms a move, a 3x-loaded machine lapped it for over 60 s)
    others = [_start_writer(path, k, pause=0.005) for k in (1, 2)]
    reader = ReplayStore.open(path)
    rng = np.random.default_rng(0)
    live_kills = 0
    try:
        for attempt in range(6):
            proc, lines = _start_writer(path, 0, seed=attempt)
            deadline = time.monotonic() + 60
            while not any(line.startswith("committed") for line in lines):  # the handshake: it is writing
                assert proc.poll() is None and time.monotonic() < deadline, f"the writer did not start: {lines}"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
            live_kills += proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # (whole lines only: the last one read before the kill may be cut short)
            committed = max((int(line.split()[1]) for line in lines if re.fullmatch(r"committed \d+\n?", line)), default=0)
            reader.refresh()
            assert reader.stream_states()[0].added >= committed, "a committed step of stream 0 was lost"
            for k in range(3):
                _check_stream_frames(reader, k)
            if len(reader) >= 32:
                batch = reader.sample(32, rng=rng)
                k = batch.index // reader.rings.stride
                p = batch.index % reader.rings.stride
                np.testing.assert_array_equal(batch.obs[:, -1, 0], ((7 * p + k) % 256).astype(np.uint8))
                np.testing.assert_array_equal(batch.reward, k.astype(np.float32))
        assert all(p.poll() is None for p, _ in others), "a writer of another stream died"
    finally:
        for p, _ in others:
            p.kill()
            p.wait()
    assert live_kills >= 5, f"only {live_kills} of 6 kills hit a live writer"
    report = verify_store(path)
    assert report.ok, report.problems[:3]
    with ReplayStore.open(path) as final:
        for k in range(3):
            _check_stream_frames(final, k)
        assert all(r.n_valid > 50 for r in final.rings.streams)
