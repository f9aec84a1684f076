"""``replaystore compact``: equivalence of the rewritten store, new layouts and capacities, damaged
chunks dropped only on request, and SIGKILL at random moments never leaving neither store."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, flip_byte_in_chunk, frame, make_store, snapshot

from replaystore import ConfigError, CorruptStoreError, ReplayStore, StoreExistsError, StoreLockedError
from replaystore.cli import main
from replaystore.cli.compact import compact_store
from replaystore.cli.verify import verify_store
from replaystore.sampling.assemble import prepare


def transitions(path: Path, n_step: int = 1) -> dict[str, np.ndarray]:
    """Every sampleable transition, oldest first, as the sampler would assemble it (slots left out)."""
    with ReplayStore.open(path) as store:
        ring = store.ring
        positions = np.arange(ring.lo, ring.added - n_step, dtype=np.int64)
        positions = positions[ring.valid[positions % ring.capacity]]
        batch = prepare(ring, store.reader, positions, n_step=n_step, gamma=0.9).finish(store.reader)
        out = {name: np.array(getattr(batch, name)) for name in ("obs", "next_obs", "action", "reward", "terminated",
                                                                 "truncated", "discount")}
        out["priority"] = ring.priority[positions % ring.capacity].copy()
        return out


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture
def wrapped(store_path: Path) -> Path:
    store = make_store(store_path, capacity=64, shard_len=16, chunk_len=4, frame_stack=3)
    fill(store, 100, episode_len=9)  # wraps; an episode is in progress at the end
    batch = store.sample(20, rng=np.random.default_rng(0))
    store.update_priorities(batch.index, np.linspace(0.1, 5.0, 20))
    store.close()
    return store_path


def test_compact_to_dst_samples_the_same(wrapped: Path, tmp_path: Path) -> None:
    before = snapshot(wrapped)
    report = compact_store(wrapped, tmp_path / "new.zarr")
    assert snapshot(wrapped) == before
    assert report.transitions_before == report.transitions_after > 0 and not report.dropped
    for n in (1, 3):
        assert_same(transitions(wrapped, n), transitions(tmp_path / "new.zarr", n))
    assert verify_store(tmp_path / "new.zarr").ok
    with ReplayStore.open(tmp_path / "new.zarr", mode="a") as store:  # the episode in progress continues
        assert store.committed.oldest == 0 and store.episode_in_progress
        store.add(frame(100 + 100_000), 0, 0.0, frame(7), False, False)  # fill()'s last next_obs is the head
    with pytest.raises(StoreExistsError):
        compact_store(wrapped, tmp_path / "new.zarr")


@pytest.mark.parametrize(("argv", "capacity"), [
    (["--capacity", "40", "--shard-len", "8", "--chunk-len", "2"], 40),
    (["--codec", "blosc:lz4", "--level", "5"], 64),
    (["--level", "9", "--chunk-len", "8"], 64),
], ids=["smaller-capacity", "blosc", "zstd-9"])
def test_compact_in_place_with_a_new_layout(wrapped: Path, argv: list[str], capacity: int,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    old = transitions(wrapped, 2)
    assert main(["compact", str(wrapped), *argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "compacted" in out and "bytes on disk" in out
    new = transitions(wrapped, 2)
    with ReplayStore.open(wrapped) as store:
        assert store.capacity == capacity
    k = len(new["action"])
    assert 0 < k <= len(old["action"])
    # the newest transitions survive unchanged (the first few may lose stack history to the cut)
    tail = {name: values[-(k - 3):] for name, values in old.items()}
    assert_same(tail, {name: values[-(k - 3):] for name, values in new.items()})
    assert verify_store(wrapped).ok
    assert not list(wrapped.parent.glob(".*compact*"))


def test_damaged_chunks_are_dropped_only_on_request(wrapped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte_in_chunk(wrapped, shard=1, chunk=1, chunks_per_shard=4)  # slots 20..23
    before = snapshot(wrapped)
    assert main(["compact", str(wrapped), "--quiet"]) == 1
    assert "--drop-damaged" in capsys.readouterr().err
    assert snapshot(wrapped) == before
    old = transitions_without_reading_damage(wrapped)
    assert main(["compact", str(wrapped), "--drop-damaged", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "dropped damaged obs shard 1 chunk 1" in out
    assert verify_store(wrapped).ok
    new = transitions(wrapped)
    assert 0 < len(new["action"]) < len(old)
    with ReplayStore.open(wrapped) as store:
        store.sample(32, rng=np.random.default_rng(0))


def test_damaged_chunks_dropped_while_splitting_into_streams(wrapped: Path, tmp_path: Path) -> None:
    flip_byte_in_chunk(wrapped, shard=1, chunk=1, chunks_per_shard=4)
    with pytest.raises(ConfigError, match=r"capacity 64 \(\S+'s\) does not split evenly into 3 streams; pass a "
                       "capacity of 63 or 66"):
        compact_store(wrapped, tmp_path / "three.zarr", num_streams=3, drop_damaged=True)
    report = compact_store(wrapped, tmp_path / "three.zarr", num_streams=3, capacity=63, drop_damaged=True)
    assert report.dropped and report.steps_dropped > 0 and report.streams_after == 3
    assert verify_store(tmp_path / "three.zarr").ok
    with ReplayStore.open(tmp_path / "three.zarr") as store:
        assert len(store) == report.transitions_after > 0
        store.sample(32, rng=np.random.default_rng(0))


def transitions_without_reading_damage(path: Path) -> np.ndarray:
    with ReplayStore.open(path) as store:
        return np.flatnonzero(store.ring.valid)


def test_damaged_scalars_are_dropped(wrapped: Path) -> None:
    flip_byte_in_chunk(wrapped, shard=2, chunk=0, chunks_per_shard=1, array="reward")
    with pytest.raises(CorruptStoreError):
        ReplayStore.open(wrapped)
    report = compact_store(wrapped, drop_damaged=True)
    assert report.dropped and report.steps_dropped >= 16
    assert verify_store(wrapped).ok
    with ReplayStore.open(wrapped) as store:
        ring = store.ring
        live = np.arange(ring.lo, ring.added) % ring.capacity
        # each kept move still carries the reward fill() gave it (i % 3 for the i-th move)
        assert set(np.unique(ring.reward[live])) <= {0.0, 1.0, 2.0}


def test_compact_refuses_a_store_being_written(wrapped: Path) -> None:
    writer = ReplayStore.open(wrapped, mode="a")
    with pytest.raises(StoreLockedError):
        compact_store(wrapped)
    writer.close()


def test_sigkill_while_compacting_leaves_old_or_new(tmp_path: Path) -> None:
    kill_compaction(tmp_path, rounds=10, seed=0)  # (80 in the slow run's test below)


@pytest.mark.slow
def test_sigkill_while_compacting_many_times(tmp_path: Path) -> None:
    kill_compaction(tmp_path, rounds=80, seed=1)


def kill_compaction(tmp_path: Path, *, rounds: int, seed: int) -> None:
    """Kill ``compact`` in place at random moments; each time the path holds the old or the new store."""
    big = tmp_path / "big.zarr"
    store = make_store(big, capacity=2048, shard_len=128, chunk_len=8, shape=(32, 32))
    obs = np.zeros((32, 32), np.uint8)
    for i in range(2500):  # wraps
        nxt = np.full((32, 32), i % 251, np.uint8)
        nxt[0, : i % 32] = 7
        end = i % 50 == 49
        store.add(obs, i % 5, float(i % 3), nxt, end, False)
        obs = np.zeros((32, 32), np.uint8) if end else nxt
    store.close()
    original = tmp_path / "original.zarr"
    shutil.copytree(big, original)
    expected = transitions(original)
    cmd = [sys.executable, "-m", "replaystore.cli", "compact", str(big), "--quiet"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    full = time.monotonic() - t0
    rng = np.random.default_rng(seed)
    outcomes = {"old": 0, "new": 0}
    for _ in range(rounds):
        shutil.rmtree(big)
        shutil.copytree(original, big)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(float(rng.uniform(0.2 * full, 1.5 * full)))  # some land after the swap, some after the end
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert verify_store(big).ok
        assert_same(transitions(big), expected)
        with ReplayStore.open(big) as s:
            outcomes["new" if s.committed.oldest == 0 and s.committed.added == 2048 else "old"] += 1
    assert outcomes["old"] and outcomes["new"], outcomes
    subprocess.run(cmd, check=True, capture_output=True)  # the next compact clears what a kill left
    assert not [p for p in tmp_path.iterdir() if ".compact-" in p.name]

