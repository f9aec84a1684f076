"""Every bad input raises the documented error, with a message that says what and how to fix,
and leaves the store on disk byte-for-byte as it was."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import OBS_SHAPE, fill, frame, make_store, snapshot

from replaystore import (
    ConfigError,
    CorruptStoreError,
    FormatVersionError,
    InvalidTransitionError,
    Layout,
    ReadOnlyError,
    ReplayStore,
    ReplayStoreError,
    SampleError,
    StoreExistsError,
    StoreNotFoundError,
)


@pytest.fixture
def filled(store_path: Path) -> ReplayStore:
    store = make_store(store_path)
    fill(store, 20, episode_len=100)  # leaves an episode in progress
    store.flush()
    return store


GOOD = frame(1)
BAD_ADDS = {
    "obs-shape": (dict(obs=np.zeros((4, 3), np.uint8)), "shape (4, 3)"),
    "obs-dtype": (dict(obs=GOOD.astype(np.float32)), "dtype float32"),
    "next-obs-shape": (dict(next_obs=np.zeros(12, np.uint8)), "next_obs has shape"),
    "nan-reward": (dict(reward=float("nan")), "finite"),
    "inf-reward": (dict(reward=float("inf")), "finite"),
    "string-reward": (dict(reward="1"), "real number"),
    "action-too-big": (dict(action=5), "outside the action space"),
    "action-negative": (dict(action=-1), "outside the action space"),
    "action-float": (dict(action=1.5), "Discrete(5)"),
    "terminated-not-bool": (dict(terminated=2), "terminated is 2"),
    "obs-does-not-continue": (dict(obs=frame(999)), "does not continue the episode"),
}


@pytest.mark.parametrize("bad", BAD_ADDS.values(), ids=BAD_ADDS.keys())
def test_bad_add_is_rejected_and_changes_nothing(filled: ReplayStore, store_path: Path, bad: tuple) -> None:
    override, message = bad
    head = filled.reader.gather(np.array([filled.added - 1]))[0]
    args = dict(obs=head, action=1, reward=0.5, next_obs=frame(7), terminated=False, truncated=False)
    args.update(override)
    before, added, length = snapshot(store_path), filled.added, len(filled)
    with pytest.raises(InvalidTransitionError, match=re.escape(message)):
        filled.add(**args)
    assert (filled.added, len(filled)) == (added, length)
    filled.flush()
    assert snapshot(store_path) == before
    filled.add(head, 1, 0.5, frame(7), False, False)  # the store still takes a good transition
    assert filled.added == added + 1
    filled.close()


def test_open_missing_path(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        ReplayStore.open(tmp_path / "nope.zarr")
    with pytest.raises(FileNotFoundError):  # also the builtin
        ReplayStore.open(tmp_path / "nope.zarr")


def test_open_something_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_text("hello")
    with pytest.raises(StoreNotFoundError, match="not a replay store"):
        ReplayStore.open(tmp_path / "dir")
    import zarr

    zarr.create_group(str(tmp_path / "plain.zarr"))
    with pytest.raises(CorruptStoreError, match="not a replay store"):
        ReplayStore.open(tmp_path / "plain.zarr")


def _edit_attrs(path: Path, edit) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    edit(doc["attributes"]["replaystore"])
    (path / "zarr.json").write_text(json.dumps(doc))


def test_newer_format_version_is_refused(filled: ReplayStore, store_path: Path) -> None:
    filled.close()
    _edit_attrs(store_path, lambda a: a.__setitem__("format_version", 99))
    before = snapshot(store_path)
    with pytest.raises(FormatVersionError, match="format version 99.*upgrade replaystore"):
        ReplayStore.open(store_path)
    assert snapshot(store_path) == before


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: _edit_attrs(p, lambda a: a["state"].__setitem__("added", "many")),
        lambda p: _edit_attrs(p, lambda a: a["state"].__setitem__("added", -3)),
        lambda p: _edit_attrs(p, lambda a: a["schema"].__setitem__("capacity", 10**30)),
        lambda p: _edit_attrs(p, lambda a: a["schema"]["observation_space"].__setitem__("shape", [3, "x"])),
        lambda p: _edit_attrs(p, lambda a: a.pop("layout")),
        lambda p: _edit_attrs(p, lambda a: a["layout"].__setitem__("shard_len", 7)),
    ],
    ids=["added-str", "added-negative", "capacity-absurd", "shape-bad", "no-layout", "shard-misfit"],
)
def test_hostile_metadata_gets_a_clear_error(filled: ReplayStore, store_path: Path, edit) -> None:
    filled.close()
    edit(store_path)
    with pytest.raises(CorruptStoreError):
        ReplayStore.open(store_path)


def test_truncated_metadata(filled: ReplayStore, store_path: Path) -> None:
    filled.close()
    raw = (store_path / "zarr.json").read_bytes()
    (store_path / "zarr.json").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorruptStoreError, match="not valid JSON"):
        ReplayStore.open(store_path)


def test_create_over_existing_store_needs_overwrite(filled: ReplayStore, store_path: Path) -> None:
    filled.close()
    before = snapshot(store_path)
    obs_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        ReplayStore.create(store_path, 64, obs_space, gym.spaces.Discrete(5), layout=Layout(16, 4))
    assert snapshot(store_path) == before
    fresh = ReplayStore.create(store_path, 64, obs_space, gym.spaces.Discrete(5), layout=Layout(16, 4), overwrite=True)
    assert len(fresh) == 0 and fresh.added == 0
    fresh.close()


def test_create_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("precious")
    obs_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
    with pytest.raises(StoreExistsError, match="not a replay store"):
        ReplayStore.create(tmp_path, 64, obs_space, gym.spaces.Discrete(5), layout=Layout(16, 4), overwrite=True)
    assert (tmp_path / "mine.txt").read_text() == "precious"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(capacity=8), "smaller than one shard"),
        (dict(capacity=1), "capacity is 1"),
        (dict(frame_stack=0), "frame_stack is 0"),
        (dict(layout=Layout(shard_len=16, obs_chunk_len=5)), "multiple of obs_chunk_len"),
        (dict(action_space=gym.spaces.MultiDiscrete([2, 3])), "Discrete or Box actions only"),
        (dict(action_space=gym.spaces.Box(0, 1, (2000,))), "1..1024 bool, int or float values"),
        (dict(observation_space=gym.spaces.Text(5)),
         "stores Box, Discrete, MultiBinary and MultiDiscrete observations, or Dict and Tuple"),
    ],
    ids=["capacity-below-shard", "capacity-tiny", "stack-zero", "chunk-misfit", "multidiscrete-actions",
         "huge-box-actions", "text-obs"],
)
def test_bad_create_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = dict(capacity=64, observation_space=gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8),
                action_space=gym.spaces.Discrete(5), frame_stack=2, layout=Layout(16, 4))
    args.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        ReplayStore.create(tmp_path / "r.zarr", **args)
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.parametrize("capacity", [2, 3, 1000, 5000])
def test_default_layout_fits_small_capacities(tmp_path: Path, capacity: int) -> None:
    with ReplayStore.create(tmp_path / "r.zarr", capacity, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                            gym.spaces.Discrete(4)) as store:
        assert store.layout.shard_len <= max(1, capacity // 4) and store.layout.shard_len % store.layout.obs_chunk_len == 0
        for t in range(2 * capacity + 3):
            store.add(np.full((84, 84), t % 256, np.uint8), 0, 0.0, np.full((84, 84), (t + 1) % 256, np.uint8), True, False)
        assert 0 < len(store) <= capacity // 2
        assert store.sample(1, rng=np.random.default_rng(0)).obs.shape == (1, 1, 84, 84)
    with pytest.raises(ConfigError, match="smaller than one shard"):
        ReplayStore.create(tmp_path / "s.zarr", 1000, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4),
                           layout=Layout(shard_len=2048, obs_chunk_len=8))


@pytest.mark.parametrize(("shape", "dtype", "chunk_len"), [((84, 84), np.uint8, 8), ((4,), np.float32, 64),
                                                          ((16, 16), np.uint8, 64), ((64, 64), np.uint8, 16)])
def test_default_chunks_hold_64_kib_and_at_most_64_frames(tmp_path: Path, shape: tuple, dtype: type,
                                                          chunk_len: int) -> None:
    """Small observations get 64-frame chunks: a batch decodes each chunk it touches whole, so
    4096-frame chunks of CartPole observations made a batch decode most of the store."""
    space = gym.spaces.Box(0, 255, shape, dtype)
    with ReplayStore.create(tmp_path / "r.zarr", 100_000, space, gym.spaces.Discrete(2)) as store:
        assert (store.layout.obs_chunk_len, store.layout.shard_len) == (chunk_len, 4096)


def test_sampling_more_than_is_stored(filled: ReplayStore, store_path: Path) -> None:
    before = snapshot(store_path)
    with pytest.raises(SampleError, match=f"holds {len(filled)} sampleable"):
        filled.sample(len(filled) + 1)
    with pytest.raises(SampleError, match="batch_size is 0"):
        filled.sample(0)
    reader = ReplayStore.open(store_path)
    with pytest.raises(ReadOnlyError, match="mode='a'"):
        reader.add(frame(0), 0, 0.0, frame(1), False, False)
    assert snapshot(store_path) == before
    empty = make_store(store_path.parent / "empty.zarr")
    with pytest.raises(SampleError, match="holds 0 sampleable"):
        empty.sample(1)


def test_every_error_is_a_replaystore_error() -> None:
    for cls in (ConfigError, CorruptStoreError, FormatVersionError, InvalidTransitionError, SampleError,
                StoreExistsError, StoreNotFoundError, ReadOnlyError):
        assert issubclass(cls, ReplayStoreError)
