"""Ground truth written down independently of the store: the steps of a deterministic episode stream,
and the identity every stored frame carries in its bytes.

Stream ``k``'s step at position ``p`` (counted from the stream's birth) shows ``frame(k, p)``, whose
first three bytes spell ``p`` (two bytes, little-endian) and ``k``: whatever the store returns, a test
reads back which step of which stream each frame is and checks it against ``step(k, p)``, with no
help from the store's own arrays.

Episodes have ``EPISODE_MOVES[(e + k) % 5]`` moves; even episodes end terminated, odd ones truncated.
A store of ``Box`` actions (``ACTION_BOX``) takes ``box_action(k, p)`` where a ``Discrete`` one takes
``step(k, p).action``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

EPISODE_MOVES = (5, 9, 3, 12, 7)
N_ACTIONS = 5
SHAPE = (3, 4)
#: the Box action space of the continuous-control ground truth: two dimensions, each bounded
ACTION_SHAPE = (2, 3)
ACTION_LOW, ACTION_HIGH = -1.0, 1.0


@dataclass(frozen=True)
class Step:
    stream: int
    position: int
    episode: int
    ep_step: int  # index within the episode
    is_last: bool  # the episode's last observation (no move from it)
    action: int
    reward: float
    terminated: bool
    truncated: bool


def frame(k: int, p: int, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    """The observation of stream ``k``'s step ``p``; its first bytes spell ``p`` and ``k``."""
    rng = np.random.default_rng([k, p])
    out = rng.integers(0, 256, size=shape, dtype=np.uint8)
    flat = out.reshape(-1)
    flat[0], flat[1], flat[2] = p & 0xFF, (p >> 8) & 0xFF, k
    return out


def box_action(k: int, p: int) -> np.ndarray:
    """The Box action stream ``k`` takes from step ``p`` (float32 in ``[-1, 1]``, the bounds included)."""
    out = np.random.default_rng([k, p, 1]).uniform(-1.0, 1.0, size=ACTION_SHAPE).astype(np.float32)
    out.flat[0] = (-1.0, 1.0, out.flat[0])[p % 3]
    return out


def identity(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(stream, position)`` arrays spelled by ``frames`` (any leading shape, then the frame's)."""
    flat = frames.reshape(*frames.shape[: frames.ndim - len(SHAPE)], -1).astype(np.int64)
    return flat[..., 2], flat[..., 0] | (flat[..., 1] << 8)


@lru_cache(maxsize=64)
def _episodes(k: int, upto: int) -> tuple[tuple[int, int], ...]:
    """``(first position, moves)`` of stream ``k``'s episodes covering positions ``0..upto``."""
    out, p, e = [], 0, 0
    while p <= upto:
        moves = EPISODE_MOVES[(e + k) % len(EPISODE_MOVES)]
        out.append((p, moves))
        p += moves + 1
        e += 1
    return tuple(out)


def step(k: int, p: int) -> Step:
    """Stream ``k``'s step at position ``p``."""
    episodes = _episodes(k, p + 64 - p % 64)
    e = max(i for i, (first, _) in enumerate(episodes) if first <= p)
    first, moves = episodes[e]
    i = p - first
    last = i == moves
    return Step(k, p, e, i, last, 0 if last else (p * 7 + k) % N_ACTIONS, 0.0 if last else ((p % 5) - 2) * 0.5,
                last is False and i == moves - 1 and e % 2 == 0, last is False and i == moves - 1 and e % 2 == 1)


def moves(k: int, count: int, start: int = 0, *, box: bool = False):
    """The first ``count`` moves of stream ``k`` from position ``start`` (the start of an episode) as
    ``(obs, action, reward, next_obs, terminated, truncated)``, what ``store.add`` takes: an
    episode's last observation is the ``next_obs`` of its last move, and the next move starts the
    next episode at the following position. ``box``: the actions are ``box_action``'s."""
    p = start
    done = 0
    while done < count:
        s = step(k, p)
        if s.is_last:
            p += 1
            continue
        yield frame(k, p), box_action(k, p) if box else s.action, s.reward, frame(k, p + 1), s.terminated, s.truncated
        done += 1
        p += 1


#: The extras of a store with extras (format/extras.py): functions of the stream and the step of the move.
EXTRAS = {"pos": "int64", "stream": "uint8", "half": ((2,), "float32")}


def move_extras(k: int, p: int) -> dict[str, Any]:
    """The extras of the move made from stream ``k``'s step ``p``."""
    return {"pos": p, "stream": k, "half": [p / 2, -k]}


def stack(k: int, p: int, frame_stack: int) -> np.ndarray:
    """``(frame_stack, *SHAPE)`` positions' frames ending at ``p``, padded with the episode's first."""
    i = step(k, p).ep_step
    return np.stack([frame(k, p - min(j, i)) for j in range(frame_stack - 1, -1, -1)])


def check_stack(frames: np.ndarray, frame_stack: int) -> tuple[int, int]:
    """Check one stack of frames against the ground truth; returns the ``(stream, position)`` of its
    newest frame."""
    ks, ps = identity(frames)
    k, p = int(ks[-1]), int(ps[-1])
    np.testing.assert_array_equal(frames, stack(k, p, frame_stack), err_msg=f"stack ending at step {p} of stream {k}")
    return k, p


def check_action(got: np.ndarray, k: int, p: int) -> None:
    """A sampled action against stream ``k``'s step ``p``: the int, or (an array) ``box_action``'s array."""
    if np.ndim(got):
        np.testing.assert_array_equal(got, box_action(k, p), err_msg=f"action of step {p} of stream {k}")
        assert got.dtype == np.float32
    else:
        assert got == step(k, p).action and np.asarray(got).dtype == np.int64


def check_batches(store: Any, *, n_step: int = 1, prioritized: bool = False, batches: int = 6) -> None:
    """Sampled transitions against the ground truth: stacks, the move, the n-step return, the next stack."""
    rng = np.random.default_rng(7)
    for _ in range(batches):
        batch = store.sample(16, rng=rng, n_step=n_step, gamma=0.5, prioritized=prioritized)
        for i in range(16):
            k, p = check_stack(batch.obs[i], store.frame_stack)
            check_action(batch.action[i], k, p)
            reward, m, ended = 0.0, 0, False
            while m < n_step and not ended:
                move = step(k, p + m)
                reward += 0.5**m * move.reward
                ended = move.terminated or move.truncated
                m += 1
            assert batch.reward[i] == pytest.approx(reward)
            assert batch.terminated[i] == step(k, p + m - 1).terminated
            assert batch.discount[i] == pytest.approx(0.0 if batch.terminated[i] else 0.5**m)
            assert check_stack(batch.next_obs[i], store.frame_stack) == (k, p + m)
