"""ReplayStoreHerBuffer: SB3's ``HerReplayBuffer`` over a replay store (real SB3 and torch on the CPU).

DQN with it learns the bit-flipping task that DQN without relabelling cannot (HER's own test); its
samples agree with SB3's ``HerReplayBuffer`` fed the same transitions; a saved run goes on with its
store and the env given back by ``load_replay_buffer``, and so does a run killed with SIGKILL; what
cannot be relabelled is refused."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from goal_env import BitFlip, Reach, reach_reward
from stable_baselines3 import DQN, SAC, HerReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples
from stable_baselines3.common.vec_env import DummyVecEnv

from replaystore import ReplayStore
from replaystore.errors import ConfigError, SampleError
from replaystore.integrations.sb3 import ReplayStoreBuffer, ReplayStoreHerBuffer


def _numpy(obs: dict) -> dict:
    return {k: v.cpu().numpy() for k, v in obs.items()}


def success(model, env: BitFlip, episodes: int = 50) -> float:
    wins = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 + ep)
        for _ in range(env.limit):
            obs, _, terminated, truncated, _ = env.step(model.predict(obs, deterministic=True)[0])
            if terminated or truncated:
                wins += int(terminated)
                break
    return wins / episodes


def test_dqn_learns_bit_flipping_with_hindsight(tmp_path) -> None:
    """8 bits, 4,000 steps: with relabelling DQN solves nearly every start (measured: 100% at 5,000
    steps with this buffer and with SB3's; 7% without relabelling; tools/bench_her.py)."""
    env = BitFlip(8)
    model = DQN("MultiInputPolicy", env, buffer_size=20_000, learning_starts=200, seed=0, device="cpu", gamma=0.95,
                learning_rate=1e-3, exploration_fraction=0.5, exploration_final_eps=0.05, batch_size=64,
                target_update_interval=500, policy_kwargs={"net_arch": [128, 128]},
                replay_buffer_class=ReplayStoreHerBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "her.zarr"), "n_sampled_goal": 4})
    model.learn(4_000)
    assert isinstance(model.replay_buffer, HerReplayBuffer)  # (so SB3 hands it the env)
    assert success(model, BitFlip(8)) >= 0.8
    store = ReplayStore.open(tmp_path / "her.zarr")
    assert len(store) > 3_000 and store.observation_space == env.observation_space


def _twin_buffers(tmp_path, strategy: str, env: type = Reach, moves: int = 600, **options) -> tuple:
    """This buffer and SB3's (each with ``options``), fed the same SAC-style transitions of two
    ``env`` (Reach-like) envs."""
    envs = DummyVecEnv([lambda: env(limit=12), lambda: env(limit=12)])
    space, actions = envs.observation_space, envs.action_space
    ours = ReplayStoreHerBuffer(5_000, space, actions, envs, device="cpu", n_envs=2, goal_selection_strategy=strategy,
                                path=str(tmp_path / "twin.zarr"), seed=0, **options)
    options.pop("info_keys", None)
    theirs = HerReplayBuffer(5_000, space, actions, envs, device="cpu", n_envs=2, goal_selection_strategy=strategy,
                             **options)
    envs.seed(0)
    obs = envs.reset()
    rng = np.random.default_rng(0)
    for _ in range(moves):
        action = rng.uniform(-1, 1, (2, 2)).astype(np.float32)
        nxt, reward, done, infos = envs.step(action)
        real_next = {k: v.copy() for k, v in nxt.items()}
        for i in np.flatnonzero(done):  # SB3 stores the terminal observation, as off_policy_algorithm does
            for k in real_next:
                real_next[k][i] = infos[i]["terminal_observation"][k]
        for buffer in (ours, theirs):
            buffer.add(obs, real_next, action, reward, done, infos)
        obs = nxt
    return ours, theirs, envs


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_samples_agree_with_sb3_her_replay_buffer(tmp_path, strategy) -> None:
    """The same transitions in both buffers: every sampled row of ours is a true transition whose
    reward is the env's compute_reward of its goal, and the relabelled share and the reward's
    distribution match SB3's."""
    ours, theirs, envs = _twin_buffers(tmp_path, strategy)
    np.random.seed(0)
    mine, sb3 = [], []
    for _ in range(30):
        batch = ours.sample(256)
        assert isinstance(batch, DictReplayBufferSamples)
        obs, nxt = _numpy(batch.observations), _numpy(batch.next_observations)
        np.testing.assert_array_equal(obs["desired_goal"], nxt["desired_goal"])
        np.testing.assert_allclose(batch.rewards.numpy()[:, 0],
                                   reach_reward(nxt["achieved_goal"], nxt["desired_goal"], {}), atol=1e-5)
        assert np.all(nxt["steps"] == obs["steps"] + 1)  # a move inside one episode
        mine.append(batch.rewards.numpy())
        sb3.append(theirs.sample(256).rewards.numpy())
    mine_r, sb3_r = np.concatenate(mine), np.concatenate(sb3)
    # the relabelled rows whose goal is the very next point (reward 0) and the mean reward, side by side
    assert abs((mine_r == 0).mean() - (sb3_r == 0).mean()) < 0.03, ((mine_r == 0).mean(), (sb3_r == 0).mean())
    assert abs(mine_r.mean() - sb3_r.mean()) < 0.05 * abs(sb3_r.mean()), (mine_r.mean(), sb3_r.mean())
    envs.close()


def test_a_run_goes_on_from_its_store(tmp_path) -> None:
    """save_replay_buffer pickles the path (not the env); load_replay_buffer gives the env back and the
    episodes that were in progress are sampled as finished ones."""
    env = DummyVecEnv([lambda: Reach(discrete=True, limit=15)])
    kwargs = {"path": str(tmp_path / "r.zarr"), "goal_selection_strategy": "final"}
    model = DQN("MultiInputPolicy", env, buffer_size=2_000, learning_starts=100, seed=1, device="cpu",
                policy_kwargs={"net_arch": [32]}, replay_buffer_class=ReplayStoreHerBuffer,
                replay_buffer_kwargs=kwargs)
    model.learn(250)
    held = model.replay_buffer.size()
    model.save(tmp_path / "model")
    model.save_replay_buffer(tmp_path / "buffer")
    again = DQN.load(tmp_path / "model", env=env, device="cpu")
    again.load_replay_buffer(tmp_path / "buffer")
    buffer = again.replay_buffer
    assert type(buffer).__name__ == "ReplayStoreHerBuffer" and buffer.env is env
    assert buffer.size() >= held - 1
    batch = buffer.sample(32)
    np.testing.assert_array_equal(_numpy(batch.observations)["desired_goal"],
                                  _numpy(batch.next_observations)["desired_goal"])
    again.learn(100, reset_num_timesteps=False)
    assert buffer.size() > held


def test_what_cannot_be_relabelled_is_refused(tmp_path) -> None:
    dict_env = DummyVecEnv([lambda: Reach(limit=10)])
    space, actions = dict_env.observation_space, dict_env.action_space
    path = str(tmp_path / "r.zarr")
    cases = [
        (dict(copy_info_dict=True), "copy_info_dict=True: the replay store keeps only the info keys it is told"),
        (dict(goal_selection_strategy="past"), "goal_selection_strategy is 'past'"),
        (dict(n_sampled_goal=-1), "n_sampled_goal is -1"),
        (dict(n_steps=3), "n_steps is 3, but a relabelled reward is one step's"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            ReplayStoreHerBuffer(100, space, actions, dict_env, device="cpu", path=path, **kwargs)
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(ConfigError, match="needs a Dict observation space with 'achieved_goal'.*ReplayStoreBuffer"):
        ReplayStoreHerBuffer(100, box, actions, dict_env, device="cpu", path=path)
    no_goal = gym.spaces.Dict({"observation": box, "achieved_goal": box})
    with pytest.raises(ConfigError, match="have no \\['desired_goal'\\]"):
        ReplayStoreHerBuffer(100, no_goal, actions, dict_env, device="cpu", path=path)
    # no env to compute rewards with (a buffer made by hand, or unpickled without set_env)
    buffer = ReplayStoreHerBuffer(100, space, actions, None, device="cpu", path=path)
    env = Reach(limit=4)
    obs, _ = env.reset(seed=0)
    for _ in range(4):
        nxt, reward, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
        done = terminated or truncated
        buffer.add({k: v[None] for k, v in obs.items()}, {k: v[None] for k, v in nxt.items()},
                   np.zeros((1, 2), np.float32), np.array([reward]), np.array([done]), [{}])
        obs = nxt
    with pytest.raises(SampleError, match="no env to compute relabelled rewards with"):
        buffer.sample(8)
    assert ReplayStoreBuffer is not ReplayStoreHerBuffer and issubclass(ReplayStoreHerBuffer, ReplayStoreBuffer)


def test_sac_with_hindsight_on_a_continuous_goal_env(tmp_path) -> None:
    """SAC trains from relabelled batches of a Box-action goal env (two envs, two streams)."""
    envs = DummyVecEnv([lambda: Reach(limit=20), lambda: Reach(limit=20)])
    model = SAC("MultiInputPolicy", envs, buffer_size=4_000, learning_starts=100, seed=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32]}, replay_buffer_class=ReplayStoreHerBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "r.zarr"), "goal_selection_strategy": "future"})
    model.learn(400)
    assert model._n_updates > 0
    batch = model.replay_buffer.sample(64)
    nxt = _numpy(batch.next_observations)
    np.testing.assert_allclose(batch.rewards.numpy()[:, 0], reach_reward(nxt["achieved_goal"], nxt["desired_goal"], {}),
                               atol=1e-5)


def test_sigkill_resume_with_hindsight(tmp_path) -> None:
    """A DQN + ReplayStoreHerBuffer run checkpointing with its buffer is killed mid-episode; DQN.load
    continues from the store (the episode in progress ends there, truncated) and relabels as before."""
    import textwrap
    from pathlib import Path

    from conftest import killed_after_checkpoints

    tests = str(Path(__file__).parent)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {tests!r})
        from replaystore.integrations.sb3 import ReplayStoreHerBuffer
        from stable_baselines3 import DQN
        from stable_baselines3.common.callbacks import CheckpointCallback
        from goal_env import BitFlip
        model = DQN("MultiInputPolicy", BitFlip(6), buffer_size=20_000, learning_starts=100, seed=0, device="cpu",
                    policy_kwargs={{"net_arch": [32]}}, replay_buffer_class=ReplayStoreHerBuffer,
                    replay_buffer_kwargs={{"path": {str(tmp_path / 'r.zarr')!r}, "goal_selection_strategy": "future"}})
        model.learn(1_000_000, callback=CheckpointCallback(300, {str(tmp_path / 'ckpt')!r}, save_replay_buffer=True))
    """))
    last, steps = killed_after_checkpoints(script, tmp_path / "ckpt")
    with ReplayStore.open(tmp_path / "r.zarr") as store:
        committed = len(store)
    assert committed >= steps - 1

    env = BitFlip(6)
    model = DQN.load(last, env=env, device="cpu")
    buffer = model.replay_buffer
    assert type(buffer).__name__ == "ReplayStoreHerBuffer" and buffer.size() == committed
    model.learn(300, reset_num_timesteps=False)
    assert buffer.size() >= committed + 300 - 1
    batch = buffer.sample(128)
    nxt = _numpy(batch.next_observations)
    reached = (nxt["achieved_goal"] == nxt["desired_goal"]).all(axis=1)
    assert np.array_equal(batch.rewards.numpy()[:, 0], np.where(reached, 0.0, -1.0))
    assert np.array_equal(_numpy(batch.observations)["desired_goal"], nxt["desired_goal"])


class TolerantReach(Reach):
    """A goal env whose reward needs its info: a goal counts as reached within ``info["tol"]``, a
    tolerance that changes with the step (``tolerance`` of the ``steps`` entry it returns)."""

    def step(self, action):
        obs, _, _, truncated, _ = super().step(action)
        tol = tolerance(obs["steps"][0])
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], [{"tol": tol}])[0])
        return obs, reward, reward == 0.0, truncated, {"tol": tol, "other": "not kept"}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        tol = np.array([i["tol"] for i in info], np.float32)
        return -(-reach_reward(achieved_goal, desired_goal, info) > tol).astype(np.float32)


def tolerance(steps: int) -> float:
    return 0.1 * (1 + int(steps) % 4)


def test_compute_reward_gets_the_kept_infos(tmp_path) -> None:
    """copy_info_dict=True with info_keys: each relabelled reward is the env's compute_reward with the
    info its transition returned (here a tolerance that changes every step), as with SB3's buffer."""
    ours, theirs, envs = _twin_buffers(tmp_path, "future", TolerantReach, 400, copy_info_dict=True, info_keys=["tol"])
    assert [e.name for e in ours.store.schema.extras] == ["tol"]
    np.random.seed(0)  # (SB3's buffer draws with numpy's global generator)
    mine, sb3 = [], []
    for _ in range(10):
        batch = ours.sample(256)
        nxt = _numpy(batch.next_observations)
        tol = np.array([tolerance(t) for t in nxt["steps"][:, 0]], np.float32)
        want = -(-reach_reward(nxt["achieved_goal"], nxt["desired_goal"], None) > tol).astype(np.float32)
        np.testing.assert_array_equal(batch.rewards.numpy()[:, 0], want)
        mine.append(batch.rewards.numpy())
        sb3.append(theirs.sample(256).rewards.numpy())
    assert abs(np.concatenate(mine).mean() - np.concatenate(sb3).mean()) < 0.05
    envs.close()
