"""TorchRL's transitions as flat dicts of numpy leaves (records.py): the names the store's extras give
the leaves, and the store's own fields (done, terminated, truncated, reward) read from them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.format.extras import NAME

Key = tuple[str, ...]
Leaves = dict[Key, np.ndarray]

#: the extras' name prefix of TensorDict leaves
LEAF = "td."
ACTION: Key = ("action",)
_PART = re.compile(r"[A-Za-z0-9_\-]+")


def leaf_name(key: Key) -> str:
    """The extra that keeps leaf ``key``: ``td.next.reward``; ``ConfigError`` for a key no name can hold."""
    name = LEAF + ".".join(key)
    if not all(_PART.fullmatch(part) for part in key) or not NAME.fullmatch(name):
        raise ConfigError(f"the key {key!r} cannot be kept in a replay store (its parts must be letters, digits, _ "
                          "and -, at most 64 characters in all with the 'td.' prefix and the dots); exclude it "
                          "before extend (td.exclude(...)) or rename it")
    return name


def leaf_key(name: str) -> Key:
    return tuple(name[len(LEAF):].split("."))


def box(values: np.ndarray) -> Any:
    """The gymnasium Box of one row of ``values``, over its dtype's whole range."""
    import gymnasium as gym

    dtype = values.dtype
    if dtype.kind == "f":
        low, high = -np.inf, np.inf
    elif dtype.kind == "b":
        low, high = 0, 1
    else:
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    return gym.spaces.Box(low=low, high=high, shape=values.shape[1:], dtype=dtype)


def done_of(leaves: Leaves) -> np.ndarray:
    rows = len(leaves[ACTION])
    for key in (("next", "done"), ("next", "terminated")):
        if key in leaves:
            flags = leaves[key].reshape(rows, -1)
            done = flags.any(axis=1)
            if ("next", "truncated") in leaves:
                done |= leaves[("next", "truncated")].reshape(rows, -1).any(axis=1)
            return done.astype(bool)
    raise AssertionError("checked before")


def flags(leaves: Leaves, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = len(done)
    truncated = (leaves[("next", "truncated")].reshape(rows, -1).any(axis=1) if ("next", "truncated") in leaves
                 else np.zeros(rows, dtype=bool))
    if ("next", "terminated") in leaves:
        terminated = leaves[("next", "terminated")].reshape(rows, -1).any(axis=1)
    else:
        terminated = done & ~truncated
    # (an end that is neither, a done alone: truncated for the store, which then starts a new episode)
    return terminated.astype(bool), ((truncated | done) & ~terminated).astype(bool)


def reward_of(leaves: Leaves) -> np.ndarray:
    rows = len(leaves[ACTION])
    reward = leaves.get(("next", "reward"))
    if reward is None:
        return np.zeros(rows, dtype=np.float32)
    return reward.reshape(rows, -1).sum(axis=1).astype(np.float32)
