"""Observation spaces that are a ``Discrete``, ``MultiBinary`` or ``MultiDiscrete`` (FrozenLake, Taxi,
CliffWalking; SB3 takes them): kept as the Box of their ints (spaces.stored_box), checked to lie in
the space, given back with the space itself; through ``inspect``, ``compact``, Minari, SB3's DQN and
the Keras DQN trainer, which learn deterministic FrozenLake from such a store."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot

from replaystore import CorruptStoreError, InvalidTransitionError, ReplayStore

SPACES = {
    "discrete": gym.spaces.Discrete(16),
    "discrete-start": gym.spaces.Discrete(5, start=-2),
    "multibinary": gym.spaces.MultiBinary(6),
    "multibinary-2d": gym.spaces.MultiBinary([2, 3]),
    "multidiscrete": gym.spaces.MultiDiscrete(np.array([[3, 4], [5, 2]]), start=np.array([[0, 1], [-1, 0]])),
}


def _fill(store: ReplayStore, space: gym.Space, moves: int, seed: int = 0) -> list[list]:
    """``moves`` random moves of observations drawn from ``space``; each episode's observations."""
    space.seed(seed)
    episodes = [[space.sample()]]
    for t in range(moves):
        nxt = space.sample()
        store.add(episodes[-1][-1], t % 2, 1.0, nxt, t % 7 == 6, False)
        episodes[-1].append(nxt)
        if t % 7 == 6:
            episodes.append([space.sample()])
    return episodes


@pytest.mark.parametrize("name", SPACES)
def test_kept_as_their_ints_and_given_back_with_the_space(tmp_path, name) -> None:
    space = SPACES[name]
    path = tmp_path / "s.zarr"
    with ReplayStore.create(path, 200, space, gym.spaces.Discrete(2), frame_stack=3) as store:
        episodes = _fill(store, space, 40)
        batch = store.sample(16, rng=np.random.default_rng(0))
        assert batch.obs.shape == (16, 3, *space.shape) and batch.obs.dtype == space.dtype
        assert all(space.contains(np.asarray(frame, space.dtype).reshape(space.shape)) for frame in batch.obs[:, -1])
    with ReplayStore.open(path) as store:
        assert store.observation_space == space
        for i, frames in enumerate(episodes[:-1]):
            np.testing.assert_array_equal(store.episode(i).obs, np.array(frames))
    summary = json.loads(subprocess.run([sys.executable, "-m", "replaystore.cli", "inspect", "--json", str(path)],
                                        capture_output=True, text=True).stdout)
    assert summary["schema"]["observation_space"]["type"] == type(space).__name__
    text = subprocess.run([sys.executable, "-m", "replaystore.cli", "inspect", str(path)], capture_output=True,
                          text=True).stdout
    assert f"observations      {type(space).__name__}(" in text and ", kept as " in text
    done = subprocess.run([sys.executable, "-m", "replaystore.cli", "compact", str(path), str(tmp_path / "c.zarr")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with ReplayStore.open(tmp_path / "c.zarr") as copy:
        assert copy.observation_space == space and len(copy) == 40


@pytest.mark.parametrize("name", SPACES)
def test_a_value_outside_the_space_is_refused_and_nothing_changes(tmp_path, name) -> None:
    space = SPACES[name]
    path = tmp_path / "s.zarr"
    store = ReplayStore.create(path, 200, space, gym.spaces.Discrete(2))
    episodes = _fill(store, space, 10)
    store.flush()
    before, held = snapshot(path), len(store)
    high = np.asarray(space.sample(), dtype=space.dtype)
    high[...] = 99
    with pytest.raises(InvalidTransitionError, match=r"next_obs holds 99, outside the observation space"):
        store.add(episodes[-1][-1], 0, 0.0, high, False, False)
    with pytest.raises(InvalidTransitionError, match=r"next_obs\[0\] holds 99"):
        store.add_batch(np.asarray(episodes[-1][-1])[None], [0], [0.0], high[None], [False], [False])
    assert len(store) == held
    store.flush()
    assert snapshot(path) == before
    store.close()


def test_damaged_space_attributes_are_named(tmp_path) -> None:
    path = tmp_path / "s.zarr"
    ReplayStore.create(path, 64, gym.spaces.Discrete(4), gym.spaces.Discrete(2)).close()
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["replaystore"]["schema"]["observation_space"]["n"] = 0
    (path / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=r"observation_space.n is 0"):
        ReplayStore.open(path)


def _wins(act, episodes: int = 10) -> int:
    env = gym.make("FrozenLake-v1", is_slippery=False)
    wins = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=ep)
        for _ in range(100):
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            if terminated or truncated:
                wins += int(reward > 0)
                break
    return wins


@pytest.mark.slow  # ~30 s: a learning check (the default run keeps the Keras DQN learning from such a store)
def test_sb3_dqn_learns_frozen_lake_with_the_store(tmp_path) -> None:
    """SB3 samples a Discrete observation as ``(batch, 1)`` int64, as its own buffer does."""
    from stable_baselines3 import DQN

    from replaystore.integrations.sb3 import ReplayStoreBuffer

    env = gym.make("FrozenLake-v1", is_slippery=False)
    model = DQN("MlpPolicy", env, learning_starts=500, exploration_fraction=0.3, train_freq=1,
                target_update_interval=200, learning_rate=1e-3, seed=0, device="cpu",
                policy_kwargs={"net_arch": [64]}, replay_buffer_class=ReplayStoreBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "f.zarr")})
    model.learn(6_000)
    batch = model.replay_buffer.sample(8)
    assert tuple(batch.observations.shape) == (8, 1) and str(batch.observations.dtype) == "torch.int64"
    assert model.replay_buffer.store.observation_space == env.observation_space
    assert _wins(lambda obs: int(model.predict(obs, deterministic=True)[0])) >= 9


@pytest.mark.slow  # ~11 s of learning; the default run keeps the other tests of Discrete observations here
def test_the_keras_dqn_learns_frozen_lake_from_such_a_store(tmp_path) -> None:
    keras = pytest.importorskip("keras")
    from replaystore.trainer import DQN

    model = keras.Sequential([keras.Input((1,), dtype="int64"), keras.layers.Embedding(16, 16),
                              keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    # gamma 0.9 and a target update every 50 steps: with 0.99 and 200, about one run in six ended with
    # its greedy policy walking into a wall for ever (a self-loop whose overestimated value decays by
    # only 1% a target update), 0 wins; 28 runs of 28 won 10 of 10 with these (measured)
    agent = DQN(model, tmp_path / "r.zarr", learning_starts=500, train_frequency=1, target_network_frequency=50,
                gamma=0.9, exploration_fraction=0.3, optimizer=keras.optimizers.Adam(1e-3), batch_size=32)
    agent.fit(gym.make("FrozenLake-v1", is_slippery=False), total_timesteps=5_000, checkpoint_dir=tmp_path / "agent")
    again = DQN.load(tmp_path / "agent")
    assert _wins(lambda obs: int(again.act(np.array([obs])))) >= 9


def test_a_minari_dataset_of_such_observations_round_trips(tmp_path, datasets_root) -> None:
    minari = pytest.importorskip("minari")
    from minari_data import record

    from replaystore.integrations.minari import minari_from_store, store_from_minari

    data = record("frozenlake/random-v0", gym.make("FrozenLake-v1"), 300)
    store_from_minari("frozenlake/random-v0", tmp_path / "f.zarr")
    minari_from_store(tmp_path / "f.zarr", "frozenlake/back-v0")
    back = minari.load_dataset("frozenlake/back-v0")
    assert back.observation_space == data.observation_space
    for a, b in zip(data.iterate_episodes(), back.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(a.observations, b.observations)


@pytest.mark.slow  # ~35 s: a learning check
def test_the_command_line_learns_slippery_frozen_lake(tmp_path, capsys) -> None:
    """``replaystore-train`` on a Discrete observation space builds ``embedded_mlp`` (each state
    embedded, then the MLP); on slippery FrozenLake (a random policy succeeds 1.5% of the time, the
    best about 75%) its greedy policy succeeded in 0.595 of 200 games after 30k steps, 0.595 and 0.735
    after 20k, and 0.495, 0.735, 0.715 and 0.735 after 12k (seeds 1 to 4; measured); the test runs
    12k with seed 1, in this process."""
    from replaystore.trainer import load_run
    from replaystore.trainer.cli import main

    run = tmp_path / "run"
    assert main(["--env-id", "FrozenLake-v1", "--total-timesteps", "12000", "--learning-starts", "1000",
                 "--train-frequency", "1", "--target-network-frequency", "500", "--exploration-fraction", "0.3",
                 "--learning-rate", "0.001", "--run-dir", str(run), "--no-progress"]) == 0, capsys.readouterr().err
    agent = load_run(run)
    assert "Embedding" in [type(layer).__name__ for layer in agent.model.layers]
    assert np.mean(agent.evaluate(gym.make("FrozenLake-v1"), episodes=200, seed=1)) >= 0.35


@pytest.mark.slow  # ~30 s: 6,000 steps of learning (test_atari_settings checks --env-kwargs reach a run's envs)
def test_env_kwargs_reach_every_env_of_the_run(tmp_path) -> None:
    """``--env-kwargs '{"is_slippery": false}'`` makes the run's envs (two acting, the evaluation's)
    FrozenLake without slip: every stored move from a state with an action lands on one state, and
    the greedy policy wins every game (the slippery best wins about 75%). At 4,000 steps the policy
    had not found the goal in 1 of 8 runs (the decoupled learner's timing varies), one in CI; at
    6,000 it had in 20 of 20 (measured, two runs at a time on 2 cores)."""
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", "--env-id", "FrozenLake-v1",
                           "--env-kwargs", '{"is_slippery": false}', "--num-envs", "2", "--total-timesteps", "6000",
                           "--buffer-size", "6000", "--learning-starts", "500", "--train-frequency", "1",
                           "--target-network-frequency", "200", "--exploration-fraction", "0.5", "--gamma", "0.9",
                           "--learning-rate", "0.001", "--eval-episodes", "20", "--sample-threads", "1",
                           "--run-dir", str(run), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run / "args.json").read_text())["env_kwargs"] == '{"is_slippery": false}'
    assert json.loads((run / "evals.jsonl").read_text().splitlines()[-1])["mean_return"] == 1.0
    with ReplayStore.open(run / "replay.zarr") as store:
        batch = store.sample(2000, rng=np.random.default_rng(0))
    landed: dict[tuple[int, int], set[int]] = {}
    for s, a, n in zip(batch.obs[:, -1], batch.action, batch.next_obs[:, -1], strict=True):
        landed.setdefault((int(s), int(a)), set()).add(int(n))
    assert len(landed) > 20 and all(len(states) == 1 for states in landed.values())
