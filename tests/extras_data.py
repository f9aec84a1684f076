"""What the extras tests share (test_extras.py, test_extras_feeds.py): a store of every kind of
extra, filled with ``conftest.fill``'s moves, each move's extras a function of its index, and the
check that a batch's extras are its moves'."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from conftest import frame, small_spaces

from replaystore import Layout, ReplayStore

EXTRAS = {"move": "int64", "act": "int16", "ok": "bool", "logp": "float32",
          "vec": ((2, 3), "float64"), "box": gym.spaces.Box(0, 9, (2,), np.uint8)}


def extras_of(i: int) -> dict:
    """Move ``i``'s extras: each a function of ``i`` (and of its action, ``i % 5``)."""
    return {"move": i, "act": i % 5, "ok": i % 3 == 0, "logp": -0.5 * i,
            "vec": np.arange(6, dtype=np.float64).reshape(2, 3) + i, "box": np.array([i % 7, 1], np.uint8)}


def create(path, *, capacity: int = 64, frame_stack: int = 2, num_streams: int = 1, **kwargs) -> ReplayStore:
    obs_space, act_space = small_spaces()
    return ReplayStore.create(path, capacity, obs_space, act_space, frame_stack, num_streams=num_streams,
                              layout=Layout(shard_len=16, obs_chunk_len=4), extras=EXTRAS, **kwargs)


def fill(store: ReplayStore, steps: int, *, start: int = 0, episode_len: int = 7) -> None:
    """``conftest.fill``'s moves, each with ``extras_of`` its index."""
    obs = frame(start)
    for i in range(start, start + steps):
        nxt = frame(i + 1 + 100_000)
        done = (i + 1) % episode_len == 0
        store.add(obs, i % 5, float(i % 3), nxt, done and i % 2 == 0, done and i % 2 == 1, extras=extras_of(i))
        obs = frame(i + 1) if done else nxt


def check_moves(extras: dict, action: np.ndarray) -> None:
    """Each row's extras are those of one move, and that move's action is ``action``."""
    move = extras["move"]
    assert extras["act"].dtype == np.int16 and extras["vec"].shape == (*move.shape, 2, 3)
    np.testing.assert_array_equal(extras["act"], move % 5)
    np.testing.assert_array_equal(action, move % 5)
    np.testing.assert_array_equal(extras["ok"], move % 3 == 0)
    np.testing.assert_array_equal(extras["logp"], (-0.5 * move).astype(np.float32))
    np.testing.assert_array_equal(extras["vec"][..., 1, 2], move + 5.0)
    np.testing.assert_array_equal(extras["box"][..., 0], move % 7)
