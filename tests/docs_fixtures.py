"""What docs' examples start from when the page does not make it itself (tests/test_docs.py): the
README's Breakout store, written the README's way, smaller."""

from __future__ import annotations

from pathlib import Path

import ale_py
import gymnasium as gym

from replaystore import ReplayStore


def breakout_store(path: str | Path, steps: int = 1_500) -> None:
    """``steps`` random moves of Breakout (84x84 frames, stacks of 4) into a new store at ``path``."""
    gym.register_envs(ale_py)
    env = gym.wrappers.AtariPreprocessing(gym.make("ALE/Breakout-v5", frameskip=1))
    with ReplayStore.create(path, capacity=100_000, observation_space=env.observation_space,
                            action_space=env.action_space, frame_stack=4) as store:
        obs, _ = env.reset(seed=0)
        for _ in range(steps):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            store.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs if not (terminated or truncated) else env.reset()[0]
    env.close()
