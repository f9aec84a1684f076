"""The narrow per-step columns (storage/columns.py) and the index of episode starts
(storage/episteps.py): each against the plain numpy array it stands for, and a store of them
reopened bit for bit."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from replaystore import ReplayStore
from replaystore.format.spaces import DiscreteSpec
from replaystore.storage.columns import FLAGS, MAX_CODES, CodeColumn, action_ram_dtype, new_columns
from replaystore.storage.episteps import EpisodeSteps, Loading

SPECS = {"action": ((), "int32"), "reward": ((), "float32"), "terminated": ((), "bool"), "truncated": ((), "bool"),
         "is_last": ((), "bool"), "ep_step": ((), "int32"), "priority": ((), "float32")}


def test_columns_index_like_the_arrays_they_stand_for() -> None:
    rng = np.random.default_rng(0)
    n = 500
    columns = new_columns(SPECS, n, action=DiscreteSpec(18))
    arrays = {name: np.zeros(n, dtype=dtype) for name, (_, dtype) in SPECS.items() if name != "ep_step"}
    arrays["valid"] = np.zeros(n, dtype=bool)
    assert columns["action"].dtype == np.uint8 and "ep_step" not in columns
    pool = {"reward": np.array([0.0, -0.0, 1.0, -1.0, 4.0, np.nan], dtype=np.float32),
            "priority": np.array([1.0, 0.0], dtype=np.float32)}
    for step in range(3000):
        name = str(rng.choice(sorted(arrays)))
        index = rng.integers(0, n, int(rng.integers(1, 9)))
        if name in pool:
            values = rng.choice(pool[name], index.size)
            if step > 2000 and name == "priority":  # past the first two values and past 256 of them
                values = rng.uniform(0, 1, index.size).astype(np.float32)
        elif name == "action":
            values = rng.integers(0, 18, index.size)
        else:
            values = rng.random(index.size) < 0.5
        if step % 3 == 0:  # one value at a time, as the writer sets them
            index, values = int(index[0]), values[0].item()
        columns[name][index] = values
        arrays[name][index] = values
        for other, array in arrays.items():  # every column still exact, bit for bit (NaNs and -0.0 too)
            got = np.asarray(columns[other][np.arange(n)], dtype=array.dtype)
            assert got.tobytes() == array.tobytes(), (step, name, other)
    assert columns["reward"].tier == 2 and columns["priority"].tier == 3


def test_a_code_column_widens_once_and_its_views_follow() -> None:
    column = CodeColumn.new(10, np.float32, bit_of=(np.zeros(10, dtype=np.uint8), 4))
    view = column.region(2, 6)
    column[:] = np.ones(10, dtype=np.float32)
    assert column.tier == 1 and column.nbytes == 0
    view[1] = 2.0  # a third value: a byte each
    assert column.tier == 2 and column[3] == 2.0
    column[:] = np.arange(MAX_CODES + 10, dtype=np.float32)[:10]
    column[0] = np.float32(MAX_CODES + 100)  # the tier holds at most MAX_CODES values: those seen so far
    for k in range(MAX_CODES):
        column[k % 10] = float(1000 + k)
    assert column.tier == 3
    np.testing.assert_array_equal(view[:], column[2:6])
    view[0] = 7.5
    assert column[2] == 7.5


def test_many_values_at_once_widen_a_bit_straight_to_the_values() -> None:
    byte = np.zeros(600, dtype=np.uint8)
    byte[::2] = 1 << 3  # another flag's bit, left alone
    column = CodeColumn.new(600, np.float32, bit_of=(byte, 4))
    column[:5] = 1.0
    values = np.arange(300, dtype=np.float32) / 7
    column[100:400] = values
    assert column.tier == 3
    np.testing.assert_array_equal(column[:5], 1.0)
    np.testing.assert_array_equal(column[100:400], values)
    assert np.all(byte[::2] & (1 << 3)) and not np.any(byte[1::2] & (1 << 3))


def test_the_flags_share_a_byte_without_touching_each_other() -> None:
    columns = new_columns(SPECS, 4)
    columns["terminated"][[0, 1]] = True
    columns["valid"][1] = True
    columns["priority"][:] = 1.0
    columns["is_last"][1] = False
    assert list(columns["terminated"][:]) == [True, True, False, False]
    assert list(columns["valid"][:]) == [False, True, False, False]
    assert list(columns["priority"][:]) == [1.0] * 4
    assert len(FLAGS) + 2 <= 8


def test_action_dtypes_hold_the_whole_space() -> None:
    assert action_ram_dtype(DiscreteSpec(18)) == np.uint8
    assert action_ram_dtype(DiscreteSpec(3, start=-1)) == np.int8
    assert action_ram_dtype(DiscreteSpec(300)) == np.uint16
    assert action_ram_dtype(DiscreteSpec(2, start=-(2**31))).itemsize == 4


def test_episode_steps_follow_the_array_they_replace() -> None:
    """Steps appended one by one into a ring that wraps, retired from the tail: the index answers
    every live slot as the per-step array would, and loads the same from a run of values."""
    rng = np.random.default_rng(1)
    cap = 64
    state = {"lo": 0, "added": 0}

    def positions_of(slots: np.ndarray) -> np.ndarray:
        return state["lo"] + (slots - state["lo"]) % cap

    steps = EpisodeSteps(cap, positions_of, lambda: (state["lo"], state["added"]))
    truth: list[int] = []
    ep = 0
    for p in range(1000):
        ep = 0 if rng.random() < 0.1 else ep + 1
        truth.append(ep)
        assert steps.append(p, ep)
        state["added"] = p + 1
        state["lo"] = max(0, p + 1 - cap)
        steps.trim(state["lo"])
        live = np.arange(state["lo"], state["added"])
        np.testing.assert_array_equal(steps.at(live), np.array(truth)[live])
        np.testing.assert_array_equal(steps[live % cap], np.array(truth)[live])
        assert steps.of(int(live[0])) == truth[live[0]]
        assert steps.starts.size <= cap + 1  # retired episodes are dropped
    again = EpisodeSteps(cap, positions_of, lambda: (state["lo"], state["added"]))
    loading = Loading(again, state["lo"], fresh=True)  # the oldest live step is mid-episode
    loading.feed(np.array(truth[state["lo"] : state["lo"] + 10]))
    loading.feed(np.array(truth[state["lo"] + 10 : state["added"]]))
    assert loading.broken == 0
    np.testing.assert_array_equal(again.starts, steps.starts[-again.starts.size :])
    saved = again.snapshot()
    again.append(state["added"], 0)
    again.restore(saved)
    np.testing.assert_array_equal(again.starts, saved)


def test_a_run_that_does_not_count_up_is_caught() -> None:
    steps = EpisodeSteps(16, lambda s: s, lambda: (0, 16))
    loading = Loading(steps, 0, fresh=True)
    loading.feed(np.array([3, 4, 0, 1, 2, 7, 8, 0], dtype=np.int32))
    assert loading.broken == 1 and loading.first_broken == 5
    loading = Loading(EpisodeSteps(16, lambda s: s, lambda: (0, 16)), 0, fresh=True)
    loading.feed(np.array([0, 1, 2, 1], dtype=np.int32))  # (a drop to anything but 0 cannot be a start)
    assert loading.broken == 1 and loading.first_broken == 3


def test_a_store_of_many_rewards_and_long_episodes_reopens_bit_for_bit(tmp_path: Path) -> None:
    """Rewards of more than 256 values (and -0.0) widen the column while adding; a store that wrapped
    mid-episode reopens with the same scalars and the same batches."""
    path = tmp_path / "s.zarr"
    store = ReplayStore.create(path, 300, gym.spaces.Box(0, 255, (4,), np.uint8), gym.spaces.Discrete(300), 3,
                               cache_bytes=1 << 20)
    rng = np.random.default_rng(2)
    rewards = np.concatenate([[-0.0, 0.0], rng.normal(size=700)]).astype(np.float32)
    frame = np.zeros(4, dtype=np.uint8)
    for t, r in enumerate(rewards):
        store.add(frame + t % 250, int(t % 300), float(r), frame + (t + 1) % 250, t % 400 == 399, False)
    assert store.rings.reward.tier == 3
    before = {name: np.asarray(values).tobytes() for name, values in store.rings.fields.items()}
    batch = store.sample(16, rng=np.random.default_rng(3), n_step=2)
    store.close()
    again = ReplayStore.open(path)
    assert again.rings.reward.tier == 3
    after = {name: np.asarray(values).tobytes() for name, values in again.rings.fields.items()}
    # (opening sets the priority of the steps that have none, the episodes' last ones, to 1.0)
    valid = np.asarray(again.rings.valid)
    for name in ("priority",):
        assert np.frombuffer(after.pop(name), np.float32)[valid].tobytes() == \
            np.frombuffer(before.pop(name), np.float32)[valid].tobytes()
    assert after == before
    other = again.sample(16, rng=np.random.default_rng(3), n_step=2)
    for field in ("obs", "next_obs", "action", "reward", "discount", "index"):
        np.testing.assert_array_equal(getattr(batch, field), getattr(other, field), err_msg=field)


def test_a_damaged_action_is_refused_not_wrapped(tmp_path: Path) -> None:
    """An int32 action beyond what the narrow column holds is a damaged store, not a silent wrap."""
    from replaystore.errors import CorruptStoreError
    from replaystore.format.shards import encode_shard

    path = tmp_path / "s.zarr"
    store = ReplayStore.create(path, 64, gym.spaces.Box(0, 255, (4,), np.uint8), gym.spaces.Discrete(4), 1)
    frame = np.zeros(4, dtype=np.uint8)
    for t in range(10):
        store.add(frame, 1, 0.0, frame, False, False)
    store.close()
    shard = next(path.glob("action/c/**/0")) if any(path.glob("action/c/**/0")) else None
    if shard is None or not shard.is_file():
        pytest.skip("the action shard's key layout changed")
    layout = ReplayStore.open(path).layout
    values = np.zeros(layout.shard_len, dtype=np.int32)
    values[:10] = 1
    values[3] = 1000
    shard.write_bytes(encode_shard(values, chunk_len=layout.shard_len, rows=64, codec=_codec(layout)))
    with pytest.raises(CorruptStoreError, match="outside the action space"):
        ReplayStore.open(path)


def _codec(layout):  # noqa: ANN001, ANN202
    from replaystore.format.shards import numcodecs_codec

    return numcodecs_codec(layout.codec)
