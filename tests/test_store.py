"""The store's contract: format readable by plain zarr, frames stored once, one writer, reopen to
append, sampling before flush, and what a reader in another process sees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import zarr
from conftest import OBS_SHAPE, fill, frame, make_store

from replaystore import Layout, ReadOnlyError, ReplayStore, StoreLockedError


def test_plain_zarr_reads_every_field(store_path: Path) -> None:
    store = make_store(store_path, capacity=64)
    fill(store, 40, episode_len=9)
    store.close()
    group = zarr.open_group(str(store_path), mode="r")
    attrs = group.attrs["replaystore"]
    assert attrs["format_version"] == 1  # one stream: the version-1 layout, unchanged
    assert attrs["schema"]["observation_space"]["shape"] == list(OBS_SHAPE)
    assert attrs["schema"]["capacity"] == 64 and attrs["schema"]["frame_stack"] == 2
    ours = ReplayStore.open(store_path)
    added = attrs["state"]["added"]
    assert added == ours.added == 40 + 40 // 9 + 1  # T+1 observations per episode
    obs = group["obs"][:added]
    np.testing.assert_array_equal(obs, ours.reader.gather(np.arange(added)))
    for name in ("action", "reward", "terminated", "truncated", "is_last", "ep_step"):
        np.testing.assert_array_equal(group[name][:added], ours.ring.fields[name][:added], err_msg=name)
    codecs = [c["name"] for c in group["obs"].metadata.to_dict()["codecs"][0]["configuration"]["codecs"]]
    assert codecs == ["bytes", "zstd", "crc32c"]
    assert group["obs"].shards == (16, *OBS_SHAPE) and group["obs"].chunks == (4, *OBS_SHAPE)


def test_each_observation_is_stored_once(store_path: Path) -> None:
    store = make_store(store_path, capacity=64)
    obs = frame(0)
    for i in range(10):
        nxt = frame(i + 1)
        store.add(obs, 0, 1.0, nxt, i == 9, False)
        obs = nxt
    assert store.added == 11  # 10 moves, 11 observations, no copies
    np.testing.assert_array_equal(store.reader.gather(np.arange(11)), np.stack([frame(i) for i in range(11)]))
    assert not store.episode_in_progress and len(store) == 10


def test_terminated_and_truncated_are_kept_apart(store_path: Path) -> None:
    store = make_store(store_path, capacity=64, frame_stack=1)
    store.add(frame(0), 1, 1.0, frame(1), True, False)
    store.add(frame(2), 2, 2.0, frame(3), False, True)
    store.add(frame(4), 3, 3.0, frame(5), True, True)
    got, discounts = {}, {}
    for seed in range(20):
        batch = store.sample(3, rng=np.random.default_rng(seed))
        got.update({int(a): (bool(te), bool(tr)) for a, te, tr in zip(batch.action, batch.terminated, batch.truncated)})
        discounts.update({int(a): float(d) for a, d in zip(batch.action, batch.discount)})
    assert got == {1: (True, False), 2: (False, True), 3: (True, True)}
    assert discounts == {1: 0.0, 2: pytest.approx(0.99), 3: 0.0}


def test_sampling_before_flush_sees_everything(store_path: Path) -> None:
    store = make_store(store_path, capacity=64, shard_len=16)
    fill(store, 10, episode_len=100)  # nothing flushed: all in the shard the writer holds in RAM
    assert store.committed.added == 0
    batch = store.sample(10, rng=np.random.default_rng(0))
    assert set(batch.index.tolist()) <= set(range(10))
    assert ReplayStore.open(store_path).added == 0  # a reader sees only commits
    store.flush()
    assert len(ReplayStore.open(store_path)) == len(store) == 10


def test_commit_happens_every_full_shard(store_path: Path) -> None:
    store = make_store(store_path, capacity=64, shard_len=16)
    fill(store, 40, episode_len=1000)
    assert store.committed.added >= 32  # two full shards written without any flush()
    reader = ReplayStore.open(store_path)
    assert reader.added == store.committed.added


def test_ring_overwrites_oldest(store_path: Path) -> None:
    store = make_store(store_path, capacity=32, shard_len=16, frame_stack=3)
    fill(store, 200, episode_len=11)
    store.flush()
    reader = ReplayStore.open(store_path)
    assert reader.ring.lo == reader.added - 32
    for seed in range(10):
        batch = reader.sample(16, rng=np.random.default_rng(seed))
        live = {p % 32: p for p in range(reader.ring.lo, reader.added)}
        for i, slot in enumerate(batch.index.tolist()):
            p = live[slot]
            assert p - 2 >= reader.ring.lo or reader.ring.ep_step[slot] < p - reader.ring.lo + 1
            np.testing.assert_array_equal(batch.obs[i][-1], reader.reader.gather(np.array([p]))[0])


def test_second_writer_is_refused_readers_are_not(store_path: Path) -> None:
    store = make_store(store_path)
    fill(store, 5)
    with pytest.raises(StoreLockedError, match="open for writing by process"):
        ReplayStore.open(store_path, mode="a")
    with pytest.raises(StoreLockedError):
        ReplayStore.create(store_path, 64, store.observation_space, store.action_space, 2,
                           layout=Layout(16, 4), overwrite=True)
    ReplayStore.open(store_path).close()  # readers are fine
    store.close()
    ReplayStore.open(store_path, mode="a").close()


def test_lock_of_a_killed_writer_does_not_block(store_path: Path) -> None:
    make_store(store_path).close()
    code = (f"import time; from replaystore import ReplayStore; s = ReplayStore.open({str(store_path)!r}, mode='a');"
            "print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    with pytest.raises(StoreLockedError, match=f"process {child.pid}"):
        ReplayStore.open(store_path, mode="a")
    child.send_signal(signal.SIGKILL)
    child.wait()
    ReplayStore.open(store_path, mode="a").close()


def test_reopen_to_append_continues_the_episode(store_path: Path) -> None:
    store = make_store(store_path, capacity=64)
    fill(store, 10, episode_len=100)
    store.close()
    again = ReplayStore.open(store_path, mode="a")
    assert again.episode_in_progress and again.committed.episode_in_progress
    assert again.committed.episodes == 1
    head = frame(10 + 100_000)  # the last next_obs fill() gave
    with pytest.raises(ValueError, match="does not continue"):
        again.add(frame(5), 0, 0.0, frame(6), False, False)
    again.add(head, 1, 1.0, frame(77), False, False)
    assert again.added == 12 and len(again) == 11
    batch = again.sample(11, rng=np.random.default_rng(0))
    while 10 not in batch.index:
        batch = again.sample(11)
    i = int(np.flatnonzero(batch.index == 10)[0])
    np.testing.assert_array_equal(batch.obs[i], np.stack([frame(9 + 100_000), head]))
    np.testing.assert_array_equal(batch.next_obs[i], np.stack([head, frame(77)]))


def test_vector_observations_stack(tmp_path: Path) -> None:
    env = gym.make("CartPole-v1")
    store = ReplayStore.create(tmp_path / "cp.zarr", 4096, env.observation_space, env.action_space, frame_stack=3)
    ref = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 3, padding_type="reset")
    obs, _ = env.reset(seed=0)
    sobs, _ = ref.reset(seed=0)
    expected = {}
    for t in range(300):
        a = t % 2
        nxt, r, te, tr, _ = env.step(a)
        snxt, *_ = ref.step(a)
        store.add(obs, a, r, nxt, te, tr)
        expected[store.added - 2] = sobs
        obs, sobs = (env.reset()[0], ref.reset()[0]) if te or tr else (nxt, snxt)
    batch = store.sample(64, rng=np.random.default_rng(0))
    assert batch.obs.shape == (64, 3, 4) and batch.obs.dtype == np.float32
    for i, slot in enumerate(batch.index.tolist()):
        np.testing.assert_array_equal(batch.obs[i], expected[slot])


def test_same_seed_same_batch(store_path: Path) -> None:
    store = make_store(store_path)
    fill(store, 50)
    store.flush()
    a = ReplayStore.open(store_path).sample(16, rng=np.random.default_rng(5), n_step=3)
    b = ReplayStore.open(store_path).sample(16, rng=np.random.default_rng(5), n_step=3)
    for field in ("obs", "action", "reward", "next_obs", "discount", "index"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_stale_partial_files_are_cleaned_on_append(store_path: Path) -> None:
    store = make_store(store_path)
    fill(store, 20)
    store.close()
    junk = store_path / "obs" / "c" / "0" / "0" / "0.deadbeef.partial"
    junk.write_bytes(b"half a shard")
    ReplayStore.open(store_path, mode="a").close()
    assert not junk.exists()
    assert json.loads((store_path / "zarr.json").read_text())["attributes"]["replaystore"]["state"]["added"] > 0
    assert os.path.exists(store_path / "obs" / "zarr.json")


def test_end_episode_closes_it_as_truncated_and_survives_reopen(store_path: Path) -> None:
    store = make_store(store_path)
    fill(store, 10, episode_len=7)  # the second episode is 3 moves in
    assert store.episode_in_progress
    before = len(store)
    assert store.end_episode() is True
    assert not store.episode_in_progress and len(store) == before
    assert store.end_episode() is False
    head = store.added - 1
    assert bool(store.ring.truncated[(head - 1) % store.capacity]) and not store.ring.terminated[(head - 1) % store.capacity]
    store.add(frame(500), 1, 1.0, frame(501), False, False)  # a new episode may start with any obs
    store.close()
    store = ReplayStore.open(store_path)
    assert store.ring.truncated[(head - 1) % store.capacity] and store.ring.is_last[head % store.capacity]
    assert store.episode_in_progress and len(store) == before + 1
    store.close()
    ro = ReplayStore.open(store_path)
    with pytest.raises(ReadOnlyError):
        ro.end_episode()


def test_disk_full_raises_a_clear_error_and_keeps_the_last_commit(store_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from replaystore import StoreWriteError
    from replaystore.cli.verify import verify_store

    store = make_store(store_path, capacity=64)
    fill(store, 21, episode_len=7)
    store.flush()
    fill(store, 14, start=21, episode_len=7)  # starts a new episode (21 is a multiple of 7)
    committed = store.committed.added  # a full shard was committed on the way
    assert committed < store.added
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreWriteError, match="disk full") as exc:
        store.flush()
    monkeypatch.setattr(os, "write", real_write)
    assert exc.value.errno == errno.ENOSPC
    assert not list(store_path.rglob("*.partial"))
    reader = ReplayStore.open(store_path)  # another process's view: the last commit, intact
    assert reader.committed.added == committed and verify_store(store_path).ok
    reader.close()
    store.flush()  # space is back: the same writer completes its commit
    store.close()
    again = ReplayStore.open(store_path)
    assert again.committed.added == store.added and len(again) == 35 and verify_store(store_path).ok


@pytest.mark.parametrize("dtype", [bool, np.int8, np.float16], ids=["bool", "int8", "float16"])
def test_the_observation_space_comes_back_for_every_dtype(tmp_path: Path, dtype) -> None:
    """gymnasium takes a uniform bound as a number but not as a numpy bool: a store of bool frames
    (a binary grid) gave no observation_space back before."""
    space = gym.spaces.Box(0, 1, (3, 2), dtype)
    ReplayStore.create(tmp_path / "r.zarr", 64, space, gym.spaces.Discrete(2)).close()
    assert ReplayStore.open(tmp_path / "r.zarr").observation_space == space
