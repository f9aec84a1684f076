"""The hyperparameters a user leaves out take the preset of the env's observations (config.PRESETS)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import pytest

from replaystore.trainer import DQN, mlp


def test_hyperparameters_not_given_take_the_preset_of_the_envs_observations(tmp_path: Path) -> None:
    """A user who gives none gets the classic-control preset on CartPole (learning from step 1,000,
    so a 2,000-step run learns instead of being refused) and cleanrl's on image frames; what is
    given stays; the optimizer the agent made runs at the preset's rate; agent.json keeps the values."""
    from replaystore.trainer.config import PRESETS

    agent = DQN(mlp((1, 4), 2, hidden_sizes=[32]), tmp_path / "cp.zarr", sample_threads=1, batch_size=64)
    assert agent.config.learning_starts is None  # (until fit sees the env)
    agent.fit(gym.make("CartPole-v1"), 1_200)
    assert {name: getattr(agent.config, name) for name in PRESETS["vectors"]} == {**PRESETS["vectors"], "batch_size": 64}
    assert float(agent.optimizer.learning_rate) == pytest.approx(2.5e-4)
    assert agent.train_steps > 0
    agent.save(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "agent.json").read_text())["config"]["n_step"] == 3
    agent.close()
    frames = DQN(keras.Sequential([keras.Input((4, 84, 84)), keras.layers.Flatten(), keras.layers.Dense(6)]),
                 tmp_path / "atari.zarr")
    frames.build(gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(6))
    assert {name: getattr(frames.config, name) for name in PRESETS["images"]} == PRESETS["images"]
    assert float(frames.optimizer.learning_rate) == pytest.approx(1e-4)
