"""Any model the user can save, the agent reloads (``check_reloads`` before a checkpointed fit, and
``DQN.load``'s ``custom_objects`` and ``safe_mode``); the best evaluation's weights that ``fit``
keeps (``agent.best``, ``best.npz``, ``restore_best_weights``, ``DQN.load(best=True)``,
``agent.holds``); and ``act`` on raw observations (the frames kept per env, padded as the store
pads, against gymnasium's ``FrameStackObservation``). CartPole at a few hundred steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import reload_models as models

from replaystore.trainer import DQN, ModelError, TrainerError, checkpoint, mlp

SMALL = {"buffer_size": 2000, "learning_starts": 100, "batch_size": 16, "train_frequency": 1,
         "target_network_frequency": 50, "sample_threads": 1}


def _fit_and_save(model: Any, tmp_path: Path, **options: Any) -> DQN:
    agent = DQN(model, tmp_path / "replay.zarr", **options, **SMALL)
    agent.fit(gym.make("CartPole-v1"), 300, checkpoint_dir=tmp_path / "agent")
    agent.close()
    return agent


@pytest.mark.parametrize(("build", "says"), [
    (lambda: models.lambda_dueling(), "register_keras_serializable"),
    (lambda: models.lambda_dueling(output_shape=False), "output_shape"),
    (lambda: models.scaled(), "custom_objects"),
], ids=["lambda-in-safe-mode", "lambda-without-output-shape", "unregistered-layer"])
def test_a_model_that_would_not_load_back_is_refused_before_a_checkpointed_fit(tmp_path: Path, build: Any,
                                                                                says: str) -> None:
    agent = DQN(build(), tmp_path / "replay.zarr", **SMALL)
    with pytest.raises(ModelError) as caught:
        agent.fit(gym.make("CartPole-v1"), 300, checkpoint_dir=tmp_path / "agent")
    message = str(caught.value)
    assert message.startswith("the model saves but does not load back") and says in message, message
    assert "\n" not in message
    assert not (tmp_path / "replay.zarr").exists() and not (tmp_path / "agent").exists()
    agent.fit(gym.make("CartPole-v1"), 300)  # (without checkpoints it trains)
    agent.close()


def test_a_registered_dueling_lambda_saves_and_loads_in_safe_mode(tmp_path: Path) -> None:
    agent = _fit_and_save(models.registered_dueling(), tmp_path)
    again = DQN.load(tmp_path / "agent")
    stacks = np.random.default_rng(1).standard_normal((8, 1, 4)).astype(np.float32)
    assert np.array_equal(again.act(stacks), agent.act(stacks))
    assert again.state.global_step == 300
    again.close()


def test_a_custom_layer_loads_through_custom_objects(tmp_path: Path) -> None:
    _fit_and_save(models.scaled(), tmp_path, custom_objects={"Scale": models.Scale})
    with pytest.raises(TrainerError) as caught:
        DQN.load(tmp_path / "agent")
    assert "custom_objects" in str(caught.value) and "\n" not in str(caught.value)
    again = DQN.load(tmp_path / "agent", custom_objects={"Scale": models.Scale})
    assert again.state.global_step == 300
    again.close()


def test_a_python_lambda_loads_only_when_the_user_turns_safe_mode_off(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as caught:
        DQN(models.doubled_by_lambda(), tmp_path / "replay.zarr", **SMALL).fit(
            gym.make("CartPole-v1"), 300, checkpoint_dir=tmp_path / "agent")
    assert "safe_mode=False" in str(caught.value)
    _fit_and_save(models.doubled_by_lambda(), tmp_path, safe_mode=False)
    with pytest.raises(TrainerError) as refused:
        DQN.load(tmp_path / "agent")  # (the saved file never turns safe mode off)
    assert "safe_mode=False" in str(refused.value) and "\n" not in str(refused.value)
    again = DQN.load(tmp_path / "agent", safe_mode=False)
    assert again.state.global_step == 300
    again.close()


def test_fit_keeps_the_best_evaluation_and_load_says_which_weights_it_holds(tmp_path: Path) -> None:
    agent = DQN(mlp((1, 4), 2, hidden_sizes=[32]), tmp_path / "replay.zarr", **SMALL)
    with pytest.raises(TrainerError, match="restore_best_weights=True needs eval_env"):
        agent.fit(gym.make("CartPole-v1"), 300, restore_best_weights=True)
    agent.fit(gym.make("CartPole-v1"), 600, eval_env=gym.make("CartPole-v1"), eval_frequency=200, eval_episodes=2,
              checkpoint_dir=tmp_path / "agent", restore_best_weights=True)
    assert agent.best is not None and agent.holds == "best"
    weights, info = agent.best
    assert info["step"] in (200, 400, 600) and len(info["returns"]) == 2
    assert all(np.array_equal(a, b) for a, b in zip(agent.model.get_weights(), weights, strict=True))
    on_disk = checkpoint.load_best(tmp_path / "agent")
    assert on_disk is not None and on_disk[1] == info
    last = DQN.load(tmp_path / "agent")  # the checkpoint goes on from the last weights
    assert last.holds == "last" and last.best is not None and last.best[1] == info
    assert "the last weights" in repr(last) and f"best evaluation {info['mean_return']:.1f}" in repr(last)
    best = DQN.load(tmp_path / "agent", best=True)
    assert best.holds == "best"
    assert all(np.array_equal(a, b) for a, b in zip(best.model.get_weights(), weights, strict=True))
    stacks = np.random.default_rng(2).standard_normal((16, 1, 4)).astype(np.float32)
    assert np.array_equal(best.act(stacks), agent.act(stacks))
    for each in (agent, last, best):
        each.close()


def test_load_best_without_an_evaluation_is_refused(tmp_path: Path) -> None:
    _fit_and_save(mlp((1, 4), 2, hidden_sizes=[8]), tmp_path)
    with pytest.raises(TrainerError, match="holds no best.npz"):
        DQN.load(tmp_path / "agent", best=True)


def test_act_on_raw_observations_stacks_them_as_gymnasium_does(tmp_path: Path) -> None:
    """frame_stack 4 on CartPole: the agent's own stacks equal FrameStackObservation's (padded with
    the first frame), across episode ends (restart=True after env.reset()) and reset()."""
    agent = DQN(mlp((4, 4), 2, hidden_sizes=[16]), tmp_path / "replay.zarr", frame_stack=4, **SMALL)
    agent.fit(gym.make("CartPole-v1"), 200)
    stacked = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4, padding_type="reset")
    raw = gym.make("CartPole-v1")
    stack, _ = stacked.reset(seed=3)
    obs, _ = raw.reset(seed=3)
    restart, games = True, 0
    for _ in range(300):
        action = agent.act(obs, restart=restart)
        assert isinstance(action, int) and action == agent.act(stack)
        stack, _, term, trunc, _ = stacked.step(action)
        obs, _, term2, trunc2, _ = raw.step(action)
        restart = False
        if term or trunc:
            assert term2 or trunc2
            games += 1
            stack, _ = stacked.reset(seed=3 + games)
            obs, _ = raw.reset(seed=3 + games)
            restart = True
    assert games >= 3
    agent.reset()  # forgets the frames: the next observation begins an episode
    obs, _ = raw.reset(seed=99)
    stack, _ = stacked.reset(seed=99)
    assert agent.act(obs) == agent.act(stack)
    with pytest.raises(TrainerError, match="act takes"):
        agent.act(np.zeros(5, np.float32))
    agent.close()


def test_act_on_a_vector_envs_observations_keeps_each_envs_frames(tmp_path: Path) -> None:
    """Three envs with gymnasium's next-step autoreset: ``restart`` is the step before's
    ``terminated | truncated`` (an ended env first gives its final frame, then, a step later, its
    new episode's first); each env's stack equals its own FrameStackObservation's until then, and
    a restarted one holds its first frame in every slot."""
    agent = DQN(mlp((4, 4), 2, hidden_sizes=[16]), tmp_path / "replay.zarr", frame_stack=4, **SMALL)
    agent.fit(gym.make("CartPole-v1"), 200)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    singles = [gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4, padding_type="reset") for _ in range(3)]
    obs, _ = envs.reset(seed=[10, 11, 12])
    stacks = [env.reset(seed=10 + i)[0] for i, env in enumerate(singles)]
    restart, ended = np.ones(3, bool), np.zeros(3, bool)
    for _ in range(500):
        actions = agent.act(obs, restart=restart)
        assert actions.shape == (3,) and np.array_equal(agent.frames.stacks, np.stack(stacks))
        obs, _, term, trunc, _ = envs.step(actions)
        for i in np.flatnonzero(~ended):
            stacks[i], _, _, _, _ = singles[i].step(int(actions[i]))
        restart, ended = ended, ended | term | trunc
        if restart.any():
            break
    assert restart.any()
    for i in np.flatnonzero(restart):
        stacks[i] = np.repeat(obs[i][None], 4, axis=0)  # (the store's padding: the first frame in every slot)
    assert np.array_equal(agent.act(obs, restart=restart), agent.act(np.stack(stacks)))
    assert np.array_equal(agent.frames.stacks, np.stack(stacks))
    agent.close()
