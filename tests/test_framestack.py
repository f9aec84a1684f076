"""Stacks at sample time are bit-for-bit what gymnasium's FrameStackObservation showed the agent.

A real ALE game (Breakout, AtariPreprocessing, terminal on life loss, a short time limit) gives
hundreds of terminations and truncations; a small store wraps many times while it is filled. The
reference is FrameStackObservation(env, 4, padding_type="reset") run alongside, keyed by ring slot.
"""

from __future__ import annotations

from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np

from replaystore import Layout, ReplayStore

gym.register_envs(ale_py)
FRAME_STACK = 4


def _atari(max_steps: int) -> gym.Env:
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, terminal_on_life_loss=True)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_steps)


def _run(tmp_path: Path, steps: int, capacity: int, n_step: int) -> None:
    env = _atari(max_steps=40)
    stacked = gym.wrappers.FrameStackObservation(_atari(max_steps=40), FRAME_STACK, padding_type="reset")
    store = ReplayStore.create(tmp_path / "r.zarr", capacity, env.observation_space, env.action_space, FRAME_STACK,
                               layout=Layout(shard_len=64, obs_chunk_len=8))
    rng = np.random.default_rng(0)
    expected: dict[int, tuple] = {}
    obs, _ = env.reset(seed=3)
    sobs, _ = stacked.reset(seed=3)
    episodes = 0
    for _ in range(steps):
        action = int(rng.integers(env.action_space.n))
        nxt, reward, term, trunc, _ = env.step(action)
        snxt, sreward, sterm, strunc, _ = stacked.step(action)
        assert np.array_equal(snxt[-1], nxt) and (reward, term, trunc) == (sreward, sterm, strunc)
        before = store.added
        store.add(obs, action, reward, nxt, term, trunc)
        for p in range(before, store.added):  # steps just written overwrite these slots
            expected.pop(p % capacity, None)
        head = store.added - 2
        expected[head % capacity] = (sobs.copy(), action, reward, snxt.copy(), term, trunc)
        if term or trunc:
            episodes += 1
            obs, _ = env.reset()
            sobs, _ = stacked.reset()
        else:
            obs, sobs = nxt, snxt
    assert episodes > 30 and store.added > 2 * capacity  # many boundaries, ring wrapped
    store.flush()

    for reader in (store, ReplayStore.open(tmp_path / "r.zarr")):
        seen = set()
        for seed in range(20):
            batch = reader.sample(32, rng=np.random.default_rng(seed))
            for i, slot in enumerate(batch.index.tolist()):
                assert slot in expected, f"sampled slot {slot} holds no live transition"
                e_obs, e_act, e_rew, e_next, e_term, e_trunc = expected[slot]
                np.testing.assert_array_equal(batch.obs[i], e_obs)
                np.testing.assert_array_equal(batch.next_obs[i], e_next)
                assert (batch.action[i], batch.reward[i], batch.terminated[i], batch.truncated[i]) == (
                    e_act, np.float32(e_rew), e_term, e_trunc)
                seen.add(slot)
        assert len(seen) > 200
    store.close()


def test_stacks_match_framestackobservation_on_breakout(tmp_path: Path) -> None:
    _run(tmp_path, steps=1500, capacity=512, n_step=1)
