"""The Keras DQN on Dict observations (goal envs), with hindsight relabelling.

A Dict env's stacks are a dict of stacks, one per key (trainer/stacks.py), bit for bit what the
store samples (test_trainer_nested.py checks it); ``dict_mlp`` takes them (Box, Discrete,
MultiBinary and MultiDiscrete entries of mixed dtypes); a vector env with a frame stack fits, saves, loads, acts on
a dict and resumes, on TensorFlow and after JAX; ``her_n_sampled_goal`` relabels with the env's
``compute_reward`` and learns 10-bit flipping, which plain DQN does not; ``fit_offline`` relabels
with its ``eval_env``'s; settings, models, envs and stores that cannot work are refused in one line
with the store as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import goal_env
import gymnasium as gym
import keras
import numpy as np
import pytest
from conftest import snapshot
from goal_env import BitFlip, Reach, Rooms

from replaystore import ReplayStore
from replaystore.trainer import DQN, TrainerError, dict_mlp, mlp

SMALL = {"buffer_size": 2000, "learning_starts": 100, "batch_size": 16, "train_frequency": 1,
         "target_network_frequency": 50, "sample_threads": 1}


def goal_model(env: Any, stack: int = 1) -> Any:
    keras.utils.set_random_seed(0)
    return dict_mlp(env.observation_space, int(env.action_space.n), frame_stack=stack, hidden_sizes=(32,))


def bit_flipping(tmp_path: Path, k: int) -> float:
    """Greedy success on 10-bit flipping after 5k steps, with ``k`` relabelled goals per real one."""
    env, eval_env = BitFlip(10), BitFlip(10)
    keras.utils.set_random_seed(0)
    agent = DQN(dict_mlp(env.observation_space, 10, hidden_sizes=(256, 256)), tmp_path / f"bits{k}.zarr",
                buffer_size=100_000, learning_starts=500, batch_size=64, train_frequency=1,
                target_network_frequency=500, learning_rate=1e-3, exploration_fraction=0.5, end_e=0.05,
                her_n_sampled_goal=k)
    agent.fit(env, 5_000)
    returns = agent.evaluate(eval_env, 100, seed=5)
    agent.close()
    return float(np.mean(np.array(returns) > -10))


@pytest.mark.slow  # ~33 s: a learning check (the command line learns bit flipping with hindsight in test_trainer_goal_cli)
def test_hindsight_learns_bit_flipping_that_plain_dqn_cannot(tmp_path: Path) -> None:
    """HER's own task: the reward is -1 until all 10 bits match, which random moves almost never do."""
    success = bit_flipping(tmp_path, 4), bit_flipping(tmp_path, 0)
    print("greedy success with and without HER", success)
    assert success[0] >= 0.8 and success[1] <= 0.05


def test_a_vector_env_fits_saves_loads_acts_and_resumes_on_dict_stacks(tmp_path: Path) -> None:
    """Reach's mixed entries (float32 points, an int64 count, a uint8 image), two frames a stack,
    four envs in four streams, relabelled with the final goal; then loaded, acting on a dict."""
    envs = gym.vector.SyncVectorEnv([lambda: Reach(discrete=True, limit=20) for _ in range(4)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    agent = DQN(goal_model(Reach(discrete=True), 2), tmp_path / "reach.zarr", frame_stack=2, her_n_sampled_goal=4,
                her_strategy="final", **SMALL)
    history = agent.fit(envs, 1200, eval_env=Reach(discrete=True, limit=20), eval_frequency=600, eval_episodes=4,
                        checkpoint_dir=tmp_path / "agent")
    assert len(history.history["eval_return"]) == 2 and np.isfinite(history.history["loss"]).all()
    assert len(agent.evaluate(envs, 8)) == 8
    learned = agent.train_steps
    assert learned > 500
    agent.close()
    doc = json.loads((tmp_path / "agent" / "agent.json").read_text())
    assert doc["stacks"]["frame_stack"] == 2 and [e[0] for e in doc["stacks"]["entries"]] == list(
        Reach().observation_space.spaces)
    loaded = DQN.load(tmp_path / "agent")
    with ReplayStore.open(tmp_path / "reach.zarr") as store:
        assert len(store.writing or store.rings.streams) == 4
        batch = store.sample(6)
    actions = loaded.act(batch.obs)
    assert actions.shape == (6,) and loaded.act({key: value[2] for key, value in batch.obs.items()}) == actions[2]
    with pytest.raises(TrainerError, match="act takes a stack of .*desired_goal: \\(2, 2\\) float32"):
        loaded.act({"observation": batch.obs["observation"]})
    loaded.fit(envs, 1600)  # the env's compute_reward again: it is not saved
    assert loaded.state.global_step >= 1600 and loaded.train_steps > learned
    loaded.close()


def test_fit_offline_relabels_with_the_eval_envs_reward(tmp_path: Path) -> None:
    env = BitFlip(6)
    agent = DQN(goal_model(env), tmp_path / "bits.zarr", **SMALL)
    agent.fit(env, 400)
    agent.close()
    offline = DQN(goal_model(env), tmp_path / "bits.zarr", her_n_sampled_goal=4, **SMALL)
    with pytest.raises(TrainerError, match="no compute_reward was found"):
        offline.fit_offline(50)
    offline.fit_offline(50, eval_env=BitFlip(6), eval_frequency=50, eval_episodes=2)
    assert 50 <= offline.train_steps < 66  # (whole learner calls of 8 steps)
    offline.fit_offline(100, compute_reward=env.compute_reward)
    assert offline.train_steps >= 100
    offline.close()


@pytest.mark.parametrize("vector", [False, True])
def test_evaluations_of_a_goal_env_report_the_share_that_reached_the_goal(tmp_path: Path, vector: bool) -> None:
    """``info["is_success"]`` at each game's end (a vector env's rows by their mask): ``eval_success``
    in the epoch's logs, ``successes`` and ``success_rate`` in ``on_evaluation``'s; on bit flipping a
    game succeeds exactly when it returns more than -6."""
    seen: list[dict] = []
    callback = keras.callbacks.Callback()
    callback.on_evaluation = lambda step, logs: seen.append(logs)  # type: ignore[attr-defined]
    eval_env = gym.vector.SyncVectorEnv([lambda: BitFlip(6)] * 3) if vector else BitFlip(6)
    agent = DQN(goal_model(BitFlip(6)), tmp_path / "bits.zarr", her_n_sampled_goal=4, **SMALL)
    history = agent.fit(BitFlip(6), 600, eval_env=eval_env, eval_frequency=300, eval_episodes=7, callbacks=[callback])
    assert len(history.history["eval_success"]) == 2 and len(seen) == 2
    for logs, rate in zip(seen, history.history["eval_success"], strict=True):
        assert len(logs["successes"]) == len(logs["returns"]) == 7
        assert logs["successes"] == [r > -6 for r in logs["returns"]]
        assert rate == logs["success_rate"] == np.mean(logs["successes"])
    assert all(isinstance(r, float) for r in agent.evaluate(eval_env, 4))  # (evaluate: the returns, as before)
    agent.close()


def test_lockstep_hindsight_one_step_a_call(tmp_path: Path) -> None:
    """Without the learner thread (``replay_ratio=0``), one gradient step a call: tf.data's batches of
    dicts as they come; learning starts once an episode has ended."""
    agent = DQN(goal_model(BitFlip(6)), tmp_path / "bits.zarr", her_n_sampled_goal=4, steps_per_call=1, replay_ratio=0,
                **{**SMALL, "learning_starts": 20, "batch_size": 4})
    agent.fit(BitFlip(6), 300)
    assert 270 <= agent.train_steps <= 280
    agent.close()


def single_input_model() -> Any:
    keras.utils.set_random_seed(0)
    return mlp((1, 6), 6, hidden_sizes=[8])


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: DQN(single_input_model(), p, **SMALL).fit(BitFlip(6), 200), "cannot take the store's stacks.*dict of stacks"),
    (lambda p: DQN(single_input_model(), p, her_n_sampled_goal=4, **SMALL).fit(gym.make("CartPole-v1"), 200),
     "hindsight relabelling needs a goal env"),
    (lambda p: DQN(goal_model(Rooms()), p, her_n_sampled_goal=4, **SMALL).fit(Rooms(), 200),
     "hindsight relabelling needs a goal env.*achieved_goal"),
    (lambda p: DQN(goal_model(BitFlip(6)), p, **SMALL).fit(BitFlip(6), 200, compute_reward=BitFlip(6).compute_reward),
     "compute_reward is for hindsight relabelling, which is off"),
    (lambda p: DQN(goal_model(BitFlip(6)), p, her_n_sampled_goal=4, **SMALL).fit(BitFlip(6), 200, compute_reward=3),
     "compute_reward is 3"),
    (lambda p: DQN(goal_model(BitFlip(6)), p, **SMALL).fit(BitFlip(6), 200, eval_env=BitFlip(7)),
     "model takes stacks of \\{achieved_goal: \\(1, 6\\) float32"),
    (lambda p: DQN(goal_model(BitFlip(6)), p, **SMALL).fit(
        gym.wrappers.TransformObservation(BitFlip(6), lambda o: {"inner": o}, gym.spaces.Dict({"inner": BitFlip(6).observation_space})),
        200), "cannot take the store's stacks, batches of \\{inner: \\{achieved_goal: .*that structure of stacks"),
], ids=["one-array-model", "box-env", "no-goals", "reward-without-her", "reward-not-callable", "other-eval-env",
        "model-of-another-structure"])
def test_what_cannot_work_is_refused_before_a_store_is_made(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(TrainerError, match=message):
        make(tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()


@pytest.mark.parametrize(("settings", "message"), [
    ({"her_n_sampled_goal": 4, "n_step": 3}, "samples 1-step transitions.*n_step=1"),
    ({"her_n_sampled_goal": 4, "prioritized": True}, "draws transitions uniformly"),
    ({"her_n_sampled_goal": -1}, "her_n_sampled_goal is -1"),
    ({"her_n_sampled_goal": 4, "her_strategy": "later"}, "her_strategy is 'later'; it must be one of future, final"),
])
def test_hindsight_settings_that_cannot_work_are_named(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(TrainerError, match=message):
        DQN(goal_model(BitFlip(6)), tmp_path / "x.zarr", **settings)


def test_a_store_of_another_dict_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "bits.zarr"
    agent = DQN(goal_model(BitFlip(6)), path, **SMALL)
    agent.fit(BitFlip(6), 150)
    agent.close()
    before = snapshot(path)
    reach = DQN(goal_model(Reach(discrete=True)), path, **SMALL)
    with pytest.raises(TrainerError, match="stores Dict.*do not match"):
        reach.fit(Reach(discrete=True), 300)
    assert snapshot(path) == before


OTHER_BACKEND_RUN = """
import sys
sys.path.insert(0, sys.argv[2])
import keras
import goal_env
from replaystore.trainer import DQN, dict_mlp
env = getattr(goal_env, sys.argv[3])(6)
keras.utils.set_random_seed(0)
agent = DQN(dict_mlp(env.observation_space, 6, hidden_sizes=(32,)), sys.argv[1] + "/bits.zarr", her_n_sampled_goal=4,
            buffer_size=2000, learning_starts=100, batch_size=16, train_frequency=1, sample_threads=1)
agent.fit(env, 600, checkpoint_dir=sys.argv[1] + "/agent")
print("backend", keras.backend.backend(), agent.train_steps)
"""


@pytest.mark.parametrize(("backend", "kind"), [("jax", "BitFlip"),  # (the others ~15 s each: slow)
                                             pytest.param("jax", "NestedBitFlip", marks=pytest.mark.slow),
                                             pytest.param("torch", "NestedBitFlip", marks=pytest.mark.slow)])
def test_dict_stacks_learn_on_another_backend_and_resume_on_tensorflow(tmp_path: Path, backend: str, kind: str) -> None:
    """Dict stacks (and a nested Dict's, goals relabelled leaf for leaf) on JAX and PyTorch, and the
    checkpoint resumed on TensorFlow."""
    pytest.importorskip(backend)
    env = {**os.environ, "KERAS_BACKEND": backend}
    out = subprocess.run([sys.executable, "-c", OTHER_BACKEND_RUN, str(tmp_path), str(Path(__file__).parent), kind],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ran_on, steps = out.stdout.split()[-2:]
    assert ran_on == backend and int(steps) > 400
    agent = DQN.load(tmp_path / "agent")
    assert agent.train_steps == int(steps)
    agent.fit(getattr(goal_env, kind)(6), 800)
    assert agent.train_steps > int(steps) and keras.backend.backend() == "tensorflow"
    agent.close()
