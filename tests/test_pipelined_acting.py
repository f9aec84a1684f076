"""Acting in two halves of the envs in turn (trainer/acting.py's ``PipelinedActing`` on envs.py's
``HalvedVectorEnv``), and the store's ``add_batch(streams=...)`` it writes with: the same moves,
streams and episodes as acting in all the envs at once, on real ALE games. Also what the docs'
example of it needs: the ready-made models built from ``envs.single_action_space.n``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from replaystore import ReplayStore
from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.trainer.acting import PipelinedActing, VectorActing
from replaystore.trainer.envs import HalvedVectorEnv, make_vector_env

FRAME = gym.spaces.Box(0, 255, (84, 84), np.uint8)


def _store(path: Path, n: int, n_actions: int) -> ReplayStore:
    return ReplayStore.create(path, 20_000, FRAME, gym.spaces.Discrete(n_actions), frame_stack=4, num_streams=n)


def _act(n_actions: int) -> Any:
    """A deterministic 'policy' of the stacks (so two ways of acting pick the same actions): FIRE (1)
    while nothing moves (Breakout's ball waits for it), else a hash of the pixels."""
    def act(stacks: np.ndarray) -> np.ndarray:
        flat = stacks.reshape(len(stacks), stacks.shape[1], -1)
        still = (flat[:, -1] == flat[:, -2]).all(axis=1)
        moves = (flat[:, -1].sum(axis=1) // 13 + flat[:, 0, 3400]) % n_actions
        return np.where(still, 1, moves).astype(np.int64)
    return act


def _moves(store: ReplayStore, stream: int) -> dict[str, np.ndarray]:
    """Every move of ``stream``, its episodes one after the other, with where each episode ended."""
    parts: dict[str, list[np.ndarray]] = {"obs": [], "action": [], "reward": [], "terminated": [], "last": []}
    for episode in store.iter_episodes(stream=stream):
        moves = len(episode.action)
        parts["obs"].append(episode.obs[:moves])
        parts["action"].append(episode.action)
        parts["reward"].append(episode.reward)
        parts["terminated"].append(episode.terminated)
        parts["last"].append(np.arange(moves) == moves - 1)
    return {k: np.concatenate(v) for k, v in parts.items()}


def test_halves_step_as_the_whole_vector_env_does() -> None:
    """Seeded alike, a HalvedVectorEnv of 5 (2 + 3) returns what one AtariVectorEnv of 5 does, step
    for step: frames, rewards, ends, lives, and env ids counted over all 5."""
    whole, halves = make_vector_env("ALE/Breakout-v5", 5), make_vector_env("ALE/Breakout-v5", 5, halves=True)
    try:
        assert isinstance(halves, HalvedVectorEnv) and halves.sizes == [2, 3] and halves.num_envs == 5
        assert halves.single_observation_space == whole.single_observation_space
        assert halves.metadata["autoreset_mode"] == whole.metadata["autoreset_mode"]
        a, b = whole.reset(seed=3), halves.reset(seed=3)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1]["lives"], b[1]["lives"])
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(400):
            actions = rng.integers(4, size=5)
            a, b = whole.step(actions), halves.step(actions)
            for x, y in zip(a[:4], b[:4]):
                assert np.array_equal(x, y)
            assert np.array_equal(np.sort(a[4]["env_id"]), np.sort(b[4]["env_id"]))
            assert np.array_equal(a[4]["lives"], b[4]["lives"])
            ended += int((a[2] | a[3]).sum())
        assert np.array_equal(b[4]["env_id"], np.arange(5))
        with pytest.raises(Exception, match="no options"):
            halves.reset(options={"reset_mask": np.ones(5, bool)})
    finally:
        whole.close()
        halves.close()


def test_pipelined_acting_writes_what_acting_in_all_envs_writes(tmp_path: Path) -> None:
    """Breakout (lives: each lost life ends the store's episode) in 4 envs, greedy on the stacks: the
    two halves in turn write every stream's moves, frames, rewards and episode ends exactly as one
    vector step of all 4 does; the first two calls only start the halves."""
    n, steps = 4, 3_000
    whole, halves = make_vector_env("ALE/Breakout-v5", n), make_vector_env("ALE/Breakout-v5", n, halves=True)
    n_actions = int(whole.single_action_space.n)
    a_store, b_store = _store(tmp_path / "a.zarr", n, n_actions), _store(tmp_path / "b.zarr", n, n_actions)
    a = VectorActing(whole, a_store, clip_reward=True, terminal_on_life_loss=True, seed=11, owned=True)
    b = PipelinedActing(halves, b_store, clip_reward=True, terminal_on_life_loss=True, seed=11, owned=True)
    act, rng = _act(n_actions), np.random.default_rng(0)
    try:
        assert b.step(act, 0.0, rng) == (0, []) and b.step(act, 0.0, rng) == (0, [])
        a_games: list[tuple[float, int]] = []
        b_games: list[tuple[float, int]] = []
        taken = 0
        while taken < steps:
            moved, ended = a.step(act, 0.0, rng)
            taken += moved
            a_games += ended
        taken = 0
        while taken < steps:
            moved, ended = b.step(act, 0.0, rng)
            assert moved in (0, 1, 2)  # one half's (a row that was a reset is not a move)
            taken += moved
            b_games += ended
    finally:
        a.close()
        b.close()
    assert len(a_store) >= steps and len(b_store) >= steps and abs(len(a_store) - len(b_store)) < n
    lost_lives = 0
    for stream in range(n):
        x, y = _moves(a_store, stream), _moves(b_store, stream)
        k = min(len(x["action"]), len(y["action"]))
        assert k > 600
        for key in x:  # (the last move of the prefix may end the episode in progress in one of them)
            assert np.array_equal(x[key][:k - 1], y[key][:k - 1]), (stream, key)
        lost_lives += int(x["last"][:k - 1].sum())
    assert lost_lives >= 8  # episodes ended along the way, at the same moves
    assert len(set(a_games) ^ set(b_games)) <= 1  # the same games ended (but one in the last step)


def test_closing_receives_the_steps_under_way_so_the_envs_reset_and_act_again(tmp_path: Path) -> None:
    """close() with both halves' steps running receives them (not written); the same envs then act
    again from a reset, as a second ``fit`` on them does."""
    envs = make_vector_env("ALE/Pong-v5", 4, halves=True)
    store = _store(tmp_path / "r.zarr", 4, int(envs.single_action_space.n))
    act, rng = _act(int(envs.single_action_space.n)), np.random.default_rng(0)
    try:
        first = PipelinedActing(envs, store, clip_reward=True, terminal_on_life_loss=True, seed=1)
        for _ in range(21):
            first.step(act, 0.5, rng)
        first.close()  # the halves were sent: one step each under way
        assert len(store) == 19 * 2
        store.end_episode()
        second = PipelinedActing(envs, store, clip_reward=True, terminal_on_life_loss=True, seed=2)
        for _ in range(10):
            second.step(act, 0.5, rng)
        second.close()
        assert len(store) == 19 * 2 + 8 * 2
    finally:
        envs.close()


def test_add_batch_to_some_streams_writes_those_and_refuses_bad_rows(tmp_path: Path) -> None:
    """``add_batch(..., streams=rows)`` writes row i to stream ``rows[i]`` and leaves the others alone;
    rows out of range or named twice, or arrays of another length, are refused with nothing written."""
    store = _store(tmp_path / "r.zarr", 4, 3)

    def frames(v: int, k: int) -> np.ndarray:
        return np.full((k, 84, 84), v, np.uint8)

    zeros = np.zeros(2, bool)
    store.add_batch(frames(1, 2), np.array([0, 1]), np.ones(2), frames(2, 2), zeros, zeros, streams=[1, 3])
    store.add_batch(frames(5, 2), np.array([2, 2]), np.zeros(2), frames(6, 2), zeros, zeros, streams=range(0, 4, 2))
    assert [r.n_valid for r in store.rings.streams] == [1, 1, 1, 1]
    for bad, error, message in (([1, 1], ConfigError, "distinct rows"), ([0, 4], ConfigError, "0..3"),
                                ([2], InvalidTransitionError, "shape")):
        with pytest.raises(error, match=message):
            store.add_batch(frames(2, 2), np.array([0, 0]), np.ones(2), frames(3, 2), zeros, zeros, streams=bad)
    assert [r.n_valid for r in store.rings.streams] == [1, 1, 1, 1]
    store.add_batch(frames(2, 1), np.array([0]), np.ones(1), frames(7, 1), zeros[:1], zeros[:1], streams=[1])
    with pytest.raises(InvalidTransitionError, match="does not continue"):  # stream 3 stopped at 2, not 9
        store.add_batch(frames(9, 1), np.array([0]), np.ones(1), frames(7, 1), zeros[:1], zeros[:1], streams=[3])
    assert [r.n_valid for r in store.rings.streams] == [1, 2, 1, 1]
    assert store.episode(stream=1).obs[:, 0, 0].tolist() == [1, 2, 7]
    assert store.episode(stream=2).obs[:, 0, 0].tolist() == [5, 6]


def test_overlap_auto_is_off_on_a_cpu_and_on_and_off_are_as_given() -> None:
    """--overlap-envs auto steps the halves only where Keras computes on a GPU: not on this CPU."""
    import keras

    from replaystore.trainer.args import Args
    from replaystore.trainer.cli import _overlap

    assert _overlap(Args(overlap_envs="auto"), keras) is False
    assert _overlap(Args(overlap_envs="on"), keras) is True and _overlap(Args(overlap_envs="off"), keras) is False


def test_the_ready_made_models_take_gymnasiums_numpy_action_counts() -> None:
    """``nature_cnn((4, 84, 84), envs.single_action_space.n)`` (a numpy int, which Keras' Dense
    refuses) builds the network; a count that is not a whole number >= 1 is a one-line ModelError."""
    from replaystore.trainer import ModelError, mlp, nature_cnn

    n = gym.spaces.Discrete(6).n
    assert isinstance(n, np.integer) and nature_cnn((4, 84, 84), n).output_shape == (None, 6)
    assert mlp((1, 4), np.int32(2), dueling=True).output_shape == (None, 2)
    for bad in (0, 2.5, "4"):
        with pytest.raises(ModelError, match="n_actions is"):
            mlp((1, 4), bad)  # type: ignore[arg-type]
