"""Extras (format/extras.py) beyond the store's own readers: blocks on threads and in decode
processes, tf.data and JAX; a store on object storage; hindsight relabelling, whose
``compute_reward`` gets them as infos; a same-step vector env's ``final_info``; the DQN trainer,
which fills them from the env's infos (test_extras.py has the rest)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import small_spaces
from extras_data import EXTRAS, check_moves, create, fill
from info_env import Reporting

from replaystore import Layout, ReplayStore


@pytest.mark.parametrize("processes", [False, True])
def test_blocks_carry_the_extras(tmp_path, processes) -> None:
    store = create(tmp_path / "x.zarr", capacity=64)
    fill(store, 60)
    store.flush()
    with store.blocks(8, batches_per_block=3, seed=1, processes=processes) as blocks:
        block = next(blocks)
        extras = {name: np.array(v) for name, v in block["extras"].items()}
        check_moves(extras, np.array(block["action"]))
        assert extras["vec"].shape == (3, 8, 2, 3)
    with store.blocks(8, batches_per_block=2, seed=1, sequence_length=4) as blocks:
        block = next(blocks)
        assert block["extras"]["move"].shape == (2, 8, 4)
        check_moves({name: np.array(v) for name, v in block["extras"].items()}, np.array(block["action"]))
    store.close()


def test_tf_data_and_jax_carry_the_extras(tmp_path) -> None:
    store = create(tmp_path / "x.zarr", capacity=64)
    fill(store, 60)
    store.flush()
    ds = store.as_dataset(8, seed=0, device=None, processes=False)
    assert ds.element_spec["extras"]["vec"].shape == (8, 2, 3)
    element = next(iter(ds))
    check_moves({name: v.numpy() for name, v in element["extras"].items()}, element["action"].numpy())
    ds.prefetcher.close()
    pytest.importorskip("jax")
    with store.jax_blocks(8, batches_per_block=2, seed=0, processes=False) as blocks:
        block = next(blocks)
        check_moves({name: np.asarray(v) for name, v in block["extras"].items()}, np.asarray(block["action"]))
    store.close()


def test_extras_on_object_storage(s3_url) -> None:
    obs_space, act_space = small_spaces()
    store = ReplayStore.create(s3_url, 64, obs_space, act_space, 2, layout=Layout(shard_len=16, obs_chunk_len=4),
                               extras=EXTRAS)
    fill(store, 49)  # (move 48 ends an episode)
    store.close()
    with ReplayStore.open(s3_url) as again:
        batch = again.sample(32, rng=np.random.default_rng(0))
        check_moves(batch.extras, batch.action)
    with ReplayStore.open(s3_url, mode="a") as more:
        fill(more, 10, start=49)
        more.flush()
        np.testing.assert_array_equal(more.episode(-1).extras["move"], [56, 57, 58])


def test_hindsight_hands_each_transitions_extras_to_compute_reward(tmp_path) -> None:
    """``compute_reward(achieved, desired, infos)`` gets each relabelled transition's extras as its info
    (as SB3's ``HerReplayBuffer`` hands the infos it copied), here a reward scale the env reports."""
    from goal_env import Reach, reach_reward

    from replaystore import HindsightSampler

    env = Reach(limit=12)
    store = ReplayStore.create(tmp_path / "her.zarr", 512, env.observation_space, env.action_space,
                               extras={"scale": "float32", "t": "int32"})
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for t in range(300):
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        nxt, reward, terminated, truncated, _ = env.step(action)
        store.add(obs, action, reward, nxt, terminated, truncated,
                  extras={"scale": 1 + t % 4, "t": t})
        obs = nxt if not (terminated or truncated) else env.reset()[0]
    seen: list[list[dict]] = []

    def scaled(achieved, desired, infos):
        seen.append(infos)
        return reach_reward(achieved, desired, infos) * np.array([info["scale"] for info in infos])

    batch = store.sample(128, sampler=HindsightSampler(scaled), rng=np.random.default_rng(1))
    rows = np.flatnonzero(batch.relabelled)
    assert rows.size and [sorted(info) for info in seen[0]] == [["scale", "t"]] * rows.size
    np.testing.assert_array_equal([info["t"] for info in seen[0]], batch.extras["t"][rows])
    goal, achieved = batch.obs["desired_goal"][rows, -1], batch.next_obs["achieved_goal"][rows, -1]
    np.testing.assert_allclose(batch.reward[rows], reach_reward(achieved, goal, None) * (1 + batch.extras["t"][rows] % 4),
                               rtol=1e-6)
    store.close()


def counting() -> gym.Env:
    return Reporting(gym.make("CartPole-v1"), lambda t: {"t": t})


def test_a_same_step_vector_env_gives_an_ended_rows_extras_in_final_info(tmp_path) -> None:
    """With same-step autoreset an ended sub-env's info is its reset's; the info its last move
    returned is ``info["final_info"]``, which ``add_batch(extras=info)`` takes for that row."""
    envs = gym.vector.SyncVectorEnv([counting] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    store = ReplayStore.create(tmp_path / "s.zarr", 3000, envs.single_observation_space, envs.single_action_space,
                               num_streams=3, extras={"t": "int32"})
    obs, _ = envs.reset(seed=0)
    for _ in range(300):
        actions = envs.action_space.sample()
        nxt, reward, terminated, truncated, info = envs.step(actions)
        store.add_batch(obs, actions, reward, nxt, terminated, truncated, info, autoreset_mode="same_step",
                        extras=info)
        obs = nxt
    whole = [e for e in store.iter_episodes(whole=True)]
    assert len(whole) > 10
    for episode in whole:  # the last move keeps its own t, not the reset's
        np.testing.assert_array_equal(episode.extras["t"], np.arange(1, len(episode) + 1))


@pytest.mark.parametrize("envs", [1, 2, "same_step"])
def test_dqn_fills_the_extras_from_the_envs_infos(tmp_path, envs) -> None:
    """DQN acting into a store with extras (a dataset's copy, fine-tuned online) keeps each from the
    env's info where it holds that key (a vector env's rows), else zeros."""
    keras = pytest.importorskip("keras")
    from replaystore.trainer import DQN

    path = tmp_path / "x.zarr"
    if envs == "same_step":
        env = gym.vector.SyncVectorEnv([counting] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    else:
        env = counting() if envs == 1 else gym.vector.SyncVectorEnv([counting] * envs)
    single = env.observation_space if envs == 1 else env.single_observation_space
    ReplayStore.create(path, 1000, single, gym.spaces.Discrete(2), num_streams=1 if envs == 1 else 2,
                       extras={"t": "int32", "unknown": ((2,), "float32")}).close()
    model = keras.Sequential([keras.Input((1, 4)), keras.layers.Flatten(), keras.layers.Dense(2)])
    # (lockstep, one gradient step a call: the 5 steps due in the last 20 env steps are taken inside the
    # loop, the learner on tf.data's batches as they come; a decoupled learner thread may not have
    # finished compiling its first call by step 120 on a loaded machine)
    agent = DQN(model, path, learning_starts=100, batch_size=8, steps_per_call=1, replay_ratio=0)
    agent.fit(env, total_timesteps=120)
    assert agent.train_steps >= 5
    agent.close()
    with ReplayStore.open(path) as store:
        assert len(store) >= 100
        for episode in store.iter_episodes():
            np.testing.assert_array_equal(episode.extras["t"], episode.first_move + np.arange(1, len(episode) + 1))
            assert not episode.extras["unknown"].any()
