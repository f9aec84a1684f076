"""``DQN.fit(env, ..., actors=N)``: Ray actor processes (a local Ray) act for an agent built in
Python, each on its own copy of the env (``gymnasium.make(env.spec)``, its wrappers too) into its
own stream, with the model as the agent saves it and its learning rule; what they cannot act with
is refused in one line before anything is written. The command line's actors (the same path) are
tests/test_actors.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv

from replaystore import ReplayStore
from replaystore.cli import main as cli_main
from replaystore.trainer import DQN, QRDQN, SAC, TrainerError, mlp, sac_mlp

pytest.importorskip("ray")


def quantiles_model() -> keras.Model:
    inputs = keras.Input((1, 5), name="stack")  # (TimeAwareObservation: CartPole's 4 numbers and the time)
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Reshape((2, 8))(keras.layers.Dense(16)(x)))


@pytest.mark.slow  # ~45 s: Ray and two actor processes (the default run keeps test_actors.py's CLI actors, the same path)
def test_actors_act_for_a_functional_qr_dqn_model_on_a_wrapped_env(tmp_path: Path) -> None:
    env = gym.wrappers.TimeAwareObservation(gym.make("CartPole-v1"))
    agent = DQN(quantiles_model(), tmp_path / "replay.zarr", rule=QRDQN(8), buffer_size=4_000, seed=3,
                learning_starts=300, batch_size=32, train_frequency=2)
    history = agent.fit(env, 1_200, actors=2, checkpoint_dir=tmp_path / "agent")
    assert agent.state.global_step >= 1_200 and agent.train_steps > 0 and history.history
    agent.close()
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        assert len(store.stream_states()) == 2 and all(st.added > 0 for st in store.stream_states())
        assert store.observation_space.shape == (5,)  # the wrapper's observations: the actors made the same env
    assert cli_main(["verify", str(tmp_path / "replay.zarr"), "--quiet"]) == 0
    again = DQN.load(tmp_path / "agent")
    assert again.rule == QRDQN(8) and again.state.global_step == agent.state.global_step


@pytest.mark.slow  # ~40 s: Ray and one actor process
def test_actors_act_for_sac_in_a_box(tmp_path: Path) -> None:
    """An actor loads SAC's model (its entropy weight's layer too) and rule, samples the policy's
    actions within the Box's bounds, and writes them as the env took them."""
    agent = DQN(sac_mlp((1, 3), 1, hidden_sizes=(32, 32)), tmp_path / "replay.zarr", rule=SAC(), buffer_size=4_000,
                seed=2, batch_size=32)
    agent.fit(gym.make("Pendulum-v1"), 800, actors=1)
    assert agent.state.global_step >= 800 and agent.train_steps > 0
    agent.close()
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        batch = store.sample(256, rng=np.random.default_rng(0))
        assert batch.action.shape == (256, 1) and np.abs(batch.action).max() <= 2.0
        assert np.unique(batch.action).size > 100  # samples of the policy, not its mean alone


@pytest.mark.parametrize(("make_env", "actors", "values", "message"), [
    (lambda: gym.make("CartPole-v1"), -1, {}, r"actors is -1; it must be an integer from 0"),
    (lambda: gym.make("CartPole-v1"), True, {}, r"actors is True"),
    (lambda: gym.make_vec("CartPole-v1", 2), 2, {}, r"with actors, pass one env made by gymnasium\.make, not a vector"),
    (lambda: CartPoleEnv(), 2, {}, r"this env has no spec"),
    (lambda: gym.make("CartPole-v1"), 2, {"replay_ratio": 0}, r"give replay_ratio 'auto' or a number > 0"),
])
def test_what_actors_cannot_act_with_is_refused_before_anything_is_written(
        tmp_path: Path, make_env: Any, actors: Any, values: dict[str, Any], message: str) -> None:
    agent = DQN(mlp((1, 4), 2), tmp_path / "replay.zarr", buffer_size=1_000, **values)
    with pytest.raises(TrainerError, match=message) as caught:
        agent.fit(make_env(), 500, actors=actors)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
