"""Which store a ``DQN`` acts into and learns from, across ``fit``, ``fit_offline``, ``save``/``load``
and ``use_store``.

``fit`` called again goes on (the store's episode in progress is closed, since acting resets the
env); a dataset the agent learned from offline is never appended to, in the same process or after
``DQN.load``, and is byte for byte as it was; ``use_store`` and ``DQN.load(..., store=PATH)`` give
the online run its own store, created with the Q-network's frame stack (also where the path holds
no store yet); a copy of the dataset with room to grow keeps its moves and takes the new ones (split
over one stream per env for a vector env, which a one-stream store is refused for, naming the copy); a
store of other stacks is refused and left closed; an agent saved before the checkpoint named the
stores it acted into still fits into its own store after learning offline from it; an env whose
frames or actions the Q-network cannot take, and a buffer that does not split over a vector env's
envs, are refused in one line before anything runs; a ``replaystore-train`` run directory loads
with ``load_run`` as an agent that evaluates, saves its Q-network and fits on into the run's store.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from conftest import snapshot

from replaystore import ReplayStore
from replaystore.trainer import DQN, TrainerError, checkpoint, load_run, mlp
from replaystore.trainer.cli import main as train

SMALL = {"buffer_size": 2000, "learning_starts": 100, "batch_size": 16, "train_frequency": 1,
         "target_network_frequency": 50, "sample_threads": 1}


def model(stack: int = 1) -> Any:
    keras.utils.set_random_seed(0)
    return mlp((stack, 4), 2, hidden_sizes=[32])


def write(path: Path, moves: int, *, stack: int = 1, seed: int = 0) -> None:
    """A CartPole store of random moves whose last episode is still in progress."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    with ReplayStore.create(path, moves, env.observation_space, env.action_space, stack) as store:
        obs, _ = env.reset(seed=seed)
        for _ in range(moves):
            next_obs, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            store.add(obs, int(rng.integers(2)), reward, next_obs, terminated, truncated)
            obs = next_obs if not (terminated or truncated) else env.reset()[0]


def test_fit_again_goes_on_from_where_the_last_fit_stopped(tmp_path: Path) -> None:
    agent = DQN(model(), tmp_path / "replay.zarr", **SMALL)
    env = gym.make("CartPole-v1")
    agent.fit(env, 295)
    agent.fit(env, 295)  # already there: nothing is added
    assert agent.state.global_step == 295 and agent.store is not None and len(agent.store) == 295
    assert list(agent.store.iter_episodes())[-1].ended == "in progress"
    agent.fit(env, 500)  # that episode is closed as truncated; a new one starts at the env's reset
    assert agent.state.global_step == 500 and len(agent.store) == 500
    episodes = list(agent.store.iter_episodes())
    agent.close()
    assert sum(len(e.reward) for e in episodes) == 500 and [e.ended for e in episodes].count("truncated") == 1


def test_a_dataset_learned_from_offline_is_never_appended_to(tmp_path: Path) -> None:
    data = tmp_path / "data.zarr"
    write(data, 600, stack=2)
    before = snapshot(data)
    agent = DQN(model(2), data, **SMALL)
    agent.fit_offline(40)
    with pytest.raises(TrainerError, match=r"learned offline from .*data.zarr and has not acted into it: fit would "
                                           r"append .* agent.use_store\(PATH\)"):
        agent.fit(gym.make("CartPole-v1"), 300)
    agent.save(tmp_path / "agent")
    agent.close()
    with pytest.raises(TrainerError, match="learned offline from"):  # nor after a load
        DQN.load(tmp_path / "agent").fit(gym.make("CartPole-v1"), 300)
    assert snapshot(data) == before

    # Its own store, created with the Q-network's stack of 2 (a vector frame would get 1 by default)
    agent = DQN.load(tmp_path / "agent")
    agent.use_store(tmp_path / "online.zarr")
    agent.fit(gym.make("CartPole-v1"), 300)
    assert agent.store is not None and agent.store.frame_stack == 2 and len(agent.store) == 300
    assert agent.train_steps > 40
    agent.save(tmp_path / "agent")
    agent.close()
    again = DQN.load(tmp_path / "agent")  # the online store is the agent's own: it goes on into it
    again.fit(gym.make("CartPole-v1"), 400)
    assert again.store is not None and len(again.store) == 400
    again.close()
    assert snapshot(data) == before


def test_load_with_a_new_store_path_creates_it_on_fit(tmp_path: Path) -> None:
    data = tmp_path / "data.zarr"
    write(data, 600)
    agent = DQN(model(), data, **SMALL)
    agent.fit_offline(40, checkpoint_dir=tmp_path / "agent")
    agent.close()
    agent = DQN.load(tmp_path / "agent", store=tmp_path / "fresh.zarr")  # holds no store yet
    assert agent.store is None and agent.train_steps == 40
    agent.fit(gym.make("CartPole-v1"), 300)
    assert agent.store is not None and len(agent.store) == 300
    agent.close()


@pytest.mark.parametrize("envs", [1, 2])
def test_a_copy_of_the_dataset_with_room_keeps_its_moves_and_takes_the_new(tmp_path: Path, envs: int) -> None:
    """With a vector env, the copy splits the dataset's episodes over one stream per env."""
    data = tmp_path / "data.zarr"
    write(data, 600)
    before = snapshot(data)
    env = gym.make("CartPole-v1") if envs == 1 else gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * envs)
    agent = DQN(model(), data, **SMALL)
    agent.fit_offline(40)
    if envs > 1:
        agent.use_store(tmp_path / "one.zarr")
        write(tmp_path / "one.zarr", 100)
        with pytest.raises(TrainerError, match=r"compact \S+one.zarr --streams 2` in place"):
            agent.fit(env, 300)
    subprocess.run([sys.executable, "-m", "replaystore.cli", "compact", str(data), str(tmp_path / "copy.zarr"),
                    "--capacity", "2000", "--streams", str(envs), "--quiet"], check=True)
    with ReplayStore.open(tmp_path / "copy.zarr") as copy:
        kept = len(copy)
        assert copy.num_streams == envs and all(ring.added > 250 for ring in copy.rings.streams)
    agent.use_store(tmp_path / "copy.zarr")
    agent.fit(env, 300)
    assert agent.store is not None and kept > 550
    assert kept + 300 <= len(agent.store) < kept + 300 + envs  # (a vector env's last call may pass 300)
    agent.close()
    assert snapshot(data) == before


def test_a_store_of_other_stacks_is_refused_and_left_closed(tmp_path: Path) -> None:
    write(tmp_path / "two.zarr", 200, stack=2)
    agent = DQN(model(1), tmp_path / "one.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 200)
    other = ReplayStore.open(tmp_path / "two.zarr", mode="a")
    with pytest.raises(TrainerError, match=r"holds stacks of \(2, 4\) float32, but this agent's Q-network takes "
                                           r"\(1, 4\) float32"):
        agent.use_store(other)
    other.close()
    assert agent.store is not None and agent.store.path == tmp_path / "one.zarr"  # still the agent's
    agent.use_store(tmp_path / "two.zarr")
    with pytest.raises(TrainerError, match=r"holds stacks of \(2, 4\)"):
        agent.fit(gym.make("CartPole-v1"), 400)
    assert agent.store is None  # opened to check, closed again
    with pytest.raises(TrainerError, match="store is a int"):
        agent.use_store(3)  # type: ignore[arg-type]


def test_an_agent_saved_before_the_stores_were_named_still_fits_into_its_own(tmp_path: Path) -> None:
    agent = DQN(model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 300)
    arrays, state = agent.checkpoint_arrays()
    agent.close()
    del state["written"], state["datasets"]  # what an earlier release wrote
    old = DQN(model(), tmp_path / "replay.zarr", **SMALL)
    old.restore(arrays, state)
    old.fit_offline(old.train_steps + 16)  # its own replay, not a dataset
    old.fit(gym.make("CartPole-v1"), 400)
    assert old.store is not None and len(old.store) == 400
    old.close()


def test_envs_the_network_or_the_store_cannot_take_are_refused_in_one_line(tmp_path: Path) -> None:
    agent = DQN(model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 200)
    assert agent.store is not None
    before = agent.store.added
    for env, message in ((gym.make("MountainCar-v0"), r"the env gives frames of Box.*\(2,\).* with Discrete\(3\), but "
                                                      r"this agent's model takes stacks of \(1, 4\) float32 and "
                                                      r"acts in 2 actions"),
                         (gym.make("Pendulum-v1"), r"with Box\(-2\.0, 2\.0, \(1,\), float32\), but this agent's model .* acts "
                                                   r"in 2 actions")):
        with pytest.raises(TrainerError, match=message):
            agent.evaluate(env, 1)
        with pytest.raises(TrainerError, match=message):  # before a step is taken, not at the first evaluation
            agent.fit(gym.make("CartPole-v1"), 400, eval_env=env, eval_frequency=100)
    assert agent.state.global_step == 200 and agent.store is not None and agent.store.added == before
    agent.use_store(tmp_path / "three.zarr")
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    with pytest.raises(TrainerError, match=r"buffer_size 2,000 does not split evenly over the env's 3 envs .*use "
                                           r"1,998 or 2,001"):
        agent.fit(envs, 500)
    assert not (tmp_path / "three.zarr").exists()
    agent.close()


def test_a_command_line_run_loads_as_an_agent_and_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train(["--env-id", "CartPole-v1", "--num-envs", "2", "--buffer-size", "2000", "--learning-starts", "100",
                  "--batch-size", "16", "--sample-threads", "1", "--hidden-sizes", "32", "--no-progress",
                  "--total-timesteps", "400", "--run-dir", str(run)]) == 0
    with pytest.raises(TrainerError, match=r"is a replaystore-train run directory, not a saved agent .*load_run\("):
        DQN.load(run)
    agent = load_run(run)
    _, state = checkpoint.load(run)
    assert agent.train_steps == state["train_steps"] > 0 and agent.state.global_step == state["global_step"]
    assert agent.store is not None and agent.store.mode == "r" and agent.store.path == run / "replay.zarr"
    assert len(agent.evaluate(gym.make("CartPole-v1"), 2)) == 2 and agent.act(np.zeros((3, 1, 4), "float32")).shape == (3,)
    agent.model.save(tmp_path / "q.keras")  # the Q-network, for use elsewhere
    stacks = np.random.default_rng(0).normal(size=(5, 1, 4)).astype("float32")
    assert np.allclose(keras.saving.load_model(tmp_path / "q.keras")(stacks), agent.model(stacks), atol=1e-6)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    agent.fit(envs, 600)  # on into the run's own store
    assert agent.state.global_step >= 600 and agent.store.mode == "a" and len(agent.store) >= 600
    agent.close()
    with pytest.raises(TrainerError, match="cannot load the run: .* holds no run"):
        load_run(tmp_path)
    # a copy of the run directory is a run of its own: its agent reads and goes on into the copy's store
    before = snapshot(run)
    agent = load_run(copy)
    assert agent.store is not None and agent.store.path == copy / "replay.zarr"
    agent.fit(envs, 700)
    assert agent.store.path == copy / "replay.zarr" and len(agent.store) >= 700
    agent.close()
    assert snapshot(run) == before
    # a copy without its store plays its weights (the network made for the env's frames); fit makes a new store
    shutil.rmtree(copy / "replay.zarr")
    agent = load_run(copy)
    try:
        assert agent.store is None and agent.state.global_step == checkpoint.load(copy)[1]["global_step"]
        assert len(agent.evaluate(gym.make("CartPole-v1"), 2)) == 2
        agent.fit(envs, agent.state.global_step + 200)
        assert agent.store is not None and agent.store.path == copy / "replay.zarr" and len(agent.store) >= 200
    finally:
        agent.close()
    assert snapshot(run) == before
