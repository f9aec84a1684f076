"""ReplayStoreBuffer with a Dict observation space: SB3's ``MultiInputPolicy`` (real SB3 and torch on
the CPU) learns with it on a goal-conditioned env, samples are SB3's ``DictReplayBufferSamples`` of
true transitions, a run goes on from its store, and a store of other observations is refused."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from goal_env import Reach, follows
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.type_aliases import DictReplayBufferSamples
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from replaystore import ReplayStore
from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.integrations.sb3 import ReplayStoreBuffer

SMALL = {"net_arch": [32, 32]}  # (copied for each model: SB3 adds its own keys to the dict)


def _numpy(obs: dict) -> dict:
    return {k: v.cpu().numpy() for k, v in obs.items()}


def test_sac_multi_input_policy_learns_from_true_transitions(tmp_path) -> None:
    envs = DummyVecEnv([lambda: Reach(limit=20), lambda: Reach(limit=20)])
    model = SAC("MultiInputPolicy", envs, buffer_size=4_000, learning_starts=100, seed=0, device="cpu",
                policy_kwargs=dict(SMALL), replay_buffer_class=ReplayStoreBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "r.zarr")})
    model.learn(400)
    assert model._n_updates > 0 and model.replay_buffer.size() == 400
    batch = model.replay_buffer.sample(64)
    assert isinstance(batch, DictReplayBufferSamples)
    obs, nxt = _numpy(batch.observations), _numpy(batch.next_observations)
    assert obs["seen"].dtype == np.uint8 and obs["steps"].shape == (64, 1) and batch.actions.shape == (64, 2)
    done = batch.dones.numpy()[:, 0]
    actions = batch.actions.numpy()
    assert all(follows(obs, actions, nxt, i) for i in range(64) if not done[i])
    store = ReplayStore.open(tmp_path / "r.zarr")
    assert store.observation_space == envs.observation_space and store.num_streams == 2


def test_dqn_n_step_and_vec_normalize(tmp_path) -> None:
    envs = VecNormalize(DummyVecEnv([lambda: Reach(discrete=True, limit=15)]), norm_obs_keys=["observation"],
                        norm_reward=False)
    model = DQN("MultiInputPolicy", envs, buffer_size=2_000, learning_starts=100, seed=1, device="cpu",
                policy_kwargs=dict(SMALL), replay_buffer_class=ReplayStoreBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "r.zarr"), "n_steps": 3})
    model.learn(300)
    rng = model.replay_buffer.side.rng
    state = rng.bit_generator.state
    raw = model.replay_buffer.sample(32)
    rng.bit_generator.state = state  # the same draws again, normalized as SB3 does
    batch = model.replay_buffer.sample(32, env=envs)
    assert batch.discounts.shape == (32, 1) and torch.all(batch.discounts <= 1)
    want = envs.normalize_obs(_numpy(raw.observations))
    np.testing.assert_allclose(batch.observations["observation"].numpy(), want["observation"], rtol=1e-6)
    assert not np.allclose(want["observation"], raw.observations["observation"].numpy())
    assert torch.equal(batch.observations["seen"], raw.observations["seen"])  # a key VecNormalize leaves alone


def test_a_run_goes_on_from_its_store_and_other_observations_are_refused(tmp_path) -> None:
    path = str(tmp_path / "r.zarr")
    env = Reach(discrete=True)
    buffer = ReplayStoreBuffer(1_000, env.observation_space, env.action_space, "cpu", path=path)
    obs, _ = env.reset(seed=0)
    for _ in range(50):
        action = env.action_space.sample()
        nxt, reward, term, trunc, _ = env.step(action)
        row = {k: v[None] for k, v in obs.items()}
        buffer.add(row, {k: v[None] for k, v in nxt.items()}, np.array([action]), np.array([reward]),
                   np.array([term or trunc]), [{"TimeLimit.truncated": trunc and not term}])
        obs = nxt if not (term or trunc) else env.reset()[0]
    with pytest.raises(InvalidTransitionError, match=r"obs\['seen'\] has shape"):
        buffer.add({**row, "seen": np.zeros((1, 4, 4), np.uint8)}, row, np.array([0]), np.array([0.0]),
                   np.array([False]), [{}])
    buffer.close()
    again = ReplayStoreBuffer(1_000, env.observation_space, env.action_space, "cpu", path=path)
    assert again.size() == 50
    again.close()
    flat = gym.spaces.Box(-1, 1, (8,), np.float32)
    with pytest.raises(ConfigError, match="holds Dict.* observations, this env gives Box"):
        ReplayStoreBuffer(1_000, flat, env.action_space, "cpu", path=path)
    with pytest.raises(ConfigError, match="Dict observations are stored whole"):
        ReplayStoreBuffer(1_000, env.observation_space, env.action_space, "cpu", path=str(tmp_path / "b.zarr"),
                          frame_stack=4)
