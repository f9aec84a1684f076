"""ReplayStoreBuffer as Stable-Baselines3's replay buffer: real SB3, real torch on the CPU, real ALE
(its frames and stacks: test_sb3_stacks.py).

- SB3's DQN and sb3-contrib's QR-DQN take the same number of gradient steps with this buffer as
  with SB3's own; so do SAC and TD3 (Box actions), whose squashed actions are sampled back exactly.
- A run killed with SIGKILL resumes with its buffer through ``DQN.load``.
- n-step returns and VecNormalize as SB3 computes them; save/load_replay_buffer; bad input.
- SB3 imported first (TensorFlow loaded) trains instead of LLVM aborting when torch loads triton.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import killed_after_checkpoints
from info_env import Reporting
from sb3_contrib import QRDQN
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from replaystore import ReplayStore
from replaystore.errors import ConfigError, InvalidTransitionError, StoreWriteError
from replaystore.integrations.sb3 import ReplayStoreBuffer

gym.register_envs(ale_py)


@pytest.mark.parametrize("algo", [DQN, QRDQN], ids=["DQN", "QRDQN"])
def test_dqn_same_gradient_steps_as_sb3_buffer(tmp_path, algo):
    """SB3's DQN and sb3-contrib's QR-DQN (the other discrete-action off-policy algorithm with a
    replay buffer) take as many gradient steps with the store as with SB3's buffer."""
    counts = []
    small = {"net_arch": [32, 32]} | ({"n_quantiles": 16} if algo is QRDQN else {})  # (200 quantiles: ~20 s a run)
    for kwargs in ({}, {"replay_buffer_class": ReplayStoreBuffer,
                        "replay_buffer_kwargs": {"path": str(tmp_path / "r.zarr")}}):
        model = algo("MlpPolicy", "CartPole-v1", buffer_size=5_000, learning_starts=200, train_freq=4,
                     gradient_steps=2, target_update_interval=250, seed=0, device="cpu", policy_kwargs=small,
                     **kwargs)
        model.learn(1_500)
        counts.append((model._n_updates, model.num_timesteps, model.replay_buffer.size()))
    assert counts[0][:2] == counts[1][:2]
    assert counts[1][2] == 1_500  # every transition stored, one stream
    assert isinstance(model.replay_buffer, ReplayBuffer)


@pytest.mark.parametrize("algo", [SAC, TD3], ids=["SAC", "TD3"])
def test_continuous_control_same_gradient_steps_as_sb3_buffer(tmp_path, algo):
    """SAC and TD3 (Box actions) take as many gradient steps with the store as with SB3's buffer; the
    store holds the actions as SB3 hands them over, squashed into Box(-1, 1)."""
    counts = []
    for kwargs in ({}, {"replay_buffer_class": ReplayStoreBuffer,
                        "replay_buffer_kwargs": {"path": str(tmp_path / "r.zarr")}}):
        model = algo("MlpPolicy", "Pendulum-v1", buffer_size=5_000, learning_starts=200, train_freq=4,
                     gradient_steps=2, seed=0, device="cpu", policy_kwargs={"net_arch": [32, 32]}, **kwargs)
        model.learn(800)
        counts.append((model._n_updates, model.num_timesteps, model.replay_buffer.size()))
    assert counts[0][:2] == counts[1][:2] and counts[0][0] > 0
    assert counts[1][2] == 800
    store = model.replay_buffer.store
    assert store.action_space == gym.spaces.Box(-1, 1, (1,), np.float32)
    assert np.abs(store.sample(64).action).max() <= 1.0


def test_box_actions_sampled_as_added(tmp_path):
    """Two Pendulum envs with actions SB3-style (squashed, float32): every sampled transition is one
    that was added, its action array included, and comes out as SB3's (batch, action_dim) float32."""
    venv = DummyVecEnv([lambda: gym.wrappers.TimeLimit(gym.make("Pendulum-v1"), 37)] * 2)
    venv.seed(3)
    rb = ReplayStoreBuffer(1_000, venv.observation_space, venv.action_space, "cpu", n_envs=2,
                           path=tmp_path / "p.zarr")
    rng = np.random.default_rng(0)
    seen: dict[bytes, tuple] = {}
    obs = venv.reset()
    for _ in range(150):
        actions = rng.uniform(-1, 1, size=(2, 1)).astype(np.float32)
        new_obs, rewards, dones, infos = venv.step(2 * actions)  # Pendulum's torque is within [-2, 2]
        next_obs = new_obs.copy()
        for i, done in enumerate(dones):
            if done:
                next_obs[i] = infos[i]["terminal_observation"]
        rb.add(obs, next_obs, actions, rewards, dones, infos)
        for i in range(2):
            seen[obs[i].tobytes() + next_obs[i].tobytes()] = (actions[i].tobytes(), np.float32(rewards[i]))
        obs = new_obs
    assert rb.size() == 300  # time limits end episodes as truncated: every move is sampleable
    for _ in range(10):
        s = rb.sample(64)
        assert s.actions.shape == (64, 1) and s.actions.dtype == torch.float32
        for j in range(64):
            key = s.observations[j].numpy().tobytes() + s.next_observations[j].numpy().tobytes()
            assert seen[key] == (s.actions[j].numpy().tobytes(), np.float32(s.rewards[j, 0].item()))
            assert s.dones[j, 0] == 0.0
    with pytest.raises(InvalidTransitionError, match="outside the action space's bounds"):
        rb.add(obs, obs, np.full((2, 1), 1.5, np.float32), np.zeros(2), np.zeros(2), [{}, {}])
    assert rb.size() == 300


def test_sigkill_resume_with_buffer(tmp_path):
    """A DQN run checkpointing with its buffer is killed; DQN.load continues with every committed
    transition and goes on adding to the same store."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from replaystore.integrations.sb3 import ReplayStoreBuffer
        from stable_baselines3 import DQN
        from stable_baselines3.common.callbacks import CheckpointCallback
        model = DQN("MlpPolicy", "CartPole-v1", buffer_size=20_000, learning_starts=100, seed=0, device="cpu",
                    replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={{"path": {str(tmp_path / 'r.zarr')!r}}})
        cb = CheckpointCallback(500, {str(tmp_path / 'ckpt')!r}, save_replay_buffer=True)
        model.learn(1_000_000, callback=cb)
    """))
    last, steps = killed_after_checkpoints(script, tmp_path / "ckpt")
    with ReplayStore.open(tmp_path / "r.zarr") as store:
        committed = len(store)
    # every transition up to the last checkpoint survived (flushed there; SB3 calls the callback
    # after a step and before storing it, so the checkpoint at N steps holds N - 1 transitions)
    assert committed >= steps - 1

    model = DQN.load(last, env=gym.make("CartPole-v1"), device="cpu")
    assert isinstance(model.replay_buffer, ReplayStoreBuffer)
    assert model.replay_buffer.size() == committed
    model.learn(600, reset_num_timesteps=False)
    assert model.replay_buffer.size() == committed + 600
    sample = model.replay_buffer.sample(32)
    assert sample.observations.shape == (32, 4)


@pytest.mark.slow  # ~20 s: a child process importing SB3, then the buffer, with TensorFlow installed
def test_sb3_imported_before_the_buffer_with_tensorflow_installed(tmp_path):
    """SB3 imported first loads TensorFlow (through tensorboard, where it is installed); torch then
    loading triton at the first Adam step would abort the process (both bundle LLVM). The buffer
    switches triton off instead, says so, and the run trains."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, warnings
        import stable_baselines3
        from stable_baselines3 import DQN
        if "tensorflow" not in sys.modules or "triton" in sys.modules:
            sys.exit(3)  # not the order this test is about
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from replaystore.integrations.sb3 import ReplayStoreBuffer
            model = DQN("MlpPolicy", "CartPole-v1", buffer_size=2_000, learning_starts=100, seed=0, device="cpu",
                        replay_buffer_class=ReplayStoreBuffer,
                        replay_buffer_kwargs={{"path": {str(tmp_path / 'r.zarr')!r}}})
        assert any("triton is switched off" in str(w.message) for w in caught), [str(w.message) for w in caught]
        model.learn(400)
        assert model._n_updates > 0
        print("trained", model._n_updates)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("SB3 does not load TensorFlow here (or triton is loaded anyway)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout


def _episodes(buffer, lengths: list[int], timeouts: set[int]) -> list[tuple]:
    """Add episodes of the given lengths to a 1-env buffer with obs = a running id; returns each move."""
    moves, t = [], 0
    for e, n in enumerate(lengths):
        for j in range(n):
            last = j == n - 1
            info = {"TimeLimit.truncated": last and e in timeouts}
            buffer.add(np.array([[t, e]], np.float32), np.array([[t + 1, e]], np.float32), np.array([0]),
                       np.array([float(t % 7)]), np.array([last]), [info])
            moves.append((t, e, float(t % 7), last and e not in timeouts, last))
            t += 1
        t += 1  # the terminal observation is its own id; the next episode starts after it
    return moves


def test_n_step_returns_as_sb3_computes_them(tmp_path):
    space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
    ours = ReplayStoreBuffer(1_000, space, gym.spaces.Discrete(2), "cpu", path=tmp_path / "r.zarr", n_steps=3,
                             gamma=0.9)
    sb3 = NStepReplayBuffer(1_000, space, gym.spaces.Discrete(2), "cpu", n_steps=3, gamma=0.9)
    lengths = [5, 1, 2, 7, 3]
    _episodes(ours, lengths, timeouts={1, 3})
    _episodes(sb3, lengths, timeouts={1, 3})
    expected = {}
    np.random.seed(0)
    for _ in range(20):
        s = sb3.sample(64)
        for j in range(64):
            expected[float(s.observations[j, 0])] = (float(s.next_observations[j, 0]), float(s.rewards[j, 0]),
                                                     float(s.dones[j, 0]), float(s.discounts[j, 0]))
    assert len(expected) == sum(lengths)
    for _ in range(10):
        s = ours.sample(64)
        for j in range(64):
            nxt, reward, done, discount = expected[float(s.observations[j, 0])]
            assert float(s.next_observations[j, 0]) == nxt
            assert float(s.rewards[j, 0]) == pytest.approx(reward, rel=1e-6)
            assert float(s.dones[j, 0]) == done
            if not done:
                assert float(s.discounts[j, 0]) == pytest.approx(discount, rel=1e-6)


def test_vecnormalize_at_sample_time(tmp_path):
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2), gamma=0.99)
    buffer = ReplayStoreBuffer(2_000, venv.observation_space, venv.action_space, "cpu", n_envs=2,
                               path=tmp_path / "r.zarr")
    venv.reset()
    raw = venv.get_original_obs()
    for _ in range(100):
        actions = np.array([venv.action_space.sample() for _ in range(2)])
        new_obs, rewards, dones, infos = venv.step(actions)
        new_raw, raw_rewards = venv.get_original_obs(), venv.get_original_reward()
        nxt = new_raw.copy()
        for i, done in enumerate(dones):
            if done:
                nxt[i] = venv.unnormalize_obs(infos[i]["terminal_observation"])
        buffer.add(raw, nxt, actions, raw_rewards, dones, infos)
        raw = new_raw
    rng_state = buffer.side.rng.bit_generator.state
    normed = buffer.sample(16, env=venv)
    buffer.side.rng.bit_generator.state = rng_state
    raw_s = buffer.sample(16)
    assert torch.allclose(normed.observations, torch.as_tensor(venv.normalize_obs(raw_s.observations.numpy())))
    assert torch.allclose(normed.rewards, torch.as_tensor(venv.normalize_reward(raw_s.rewards.numpy())))


def test_save_and_load_replay_buffer_hold_the_path(tmp_path, caplog):
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=5_000, learning_starts=100, seed=0, device="cpu",
                replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"path": str(tmp_path / "r.zarr")})
    model.learn(700)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    assert (tmp_path / "buffer.pkl").stat().st_size < 20_000  # the path, not the transitions
    assert "saved as its path" in caplog.text
    model.load_replay_buffer(tmp_path / "buffer.pkl")
    assert model.replay_buffer.size() == 700
    model.learn(300, reset_num_timesteps=False)
    assert model.replay_buffer.size() == 1_000
    clone = pickle.loads(pickle.dumps(model.replay_buffer))
    assert clone.path == model.replay_buffer.path


def test_bad_input_refused_and_nothing_lost(tmp_path):
    box = gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)
    with pytest.raises(ConfigError, match="Discrete or Box actions only"):
        ReplayStoreBuffer(100, box, gym.spaces.MultiBinary(3), "cpu", path=tmp_path / "a.zarr")
    with pytest.raises(ConfigError, match="SB3's policies take a Dict of Boxes and the like, not a nested Dict"):
        ReplayStoreBuffer(100, gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Discrete(3)})}),
                          gym.spaces.Discrete(2), "cpu",
                          path=tmp_path / "a.zarr")
    with pytest.raises(ConfigError, match="needs a path"):
        ReplayStoreBuffer(100, box, gym.spaces.Discrete(2), "cpu")

    # frame_stack=4 said, but the observations are not stacks: refused at the first add, nothing made
    rng = np.random.default_rng(0)
    buffer = ReplayStoreBuffer(256, box, gym.spaces.Discrete(2), "cpu", path=tmp_path / "b.zarr", frame_stack=4)
    noise = rng.integers(1, 255, size=(1, 4, 8, 8), dtype=np.uint8)
    with pytest.raises(ConfigError, match="not frame stacks of k=4"):
        buffer.add(noise, noise, np.array([0]), np.array([1.0]), np.array([False]), [{}])
    assert not (tmp_path / "b.zarr").exists()

    # a stack that stops being a stack mid-episode: refused, every transition before it kept
    buffer = ReplayStoreBuffer(256, box, gym.spaces.Discrete(2), "cpu", path=tmp_path / "c.zarr")
    frames = rng.integers(1, 255, size=(40, 1, 8, 8), dtype=np.uint8)
    stack = np.zeros((1, 4, 8, 8), np.uint8)
    stack[0, 3] = frames[0, 0]
    for t in range(1, 30):
        nxt = np.concatenate([stack[:, 1:], frames[t][None]], axis=1)
        buffer.add(stack, nxt, np.array([1]), np.array([0.5]), np.array([False]), [{}])
        stack = nxt
    assert buffer.side.stacks.padding == "zero" and buffer.size() == 29
    broken = stack.copy()
    broken[0, 0] ^= 1
    with pytest.raises(InvalidTransitionError, match="not obs\\[0\\] moved on by one frame"):
        buffer.add(stack, broken, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    assert buffer.size() == 29
    nxt = np.concatenate([stack[:, 1:], frames[30][None]], axis=1)
    for done in (np.array(["False"]), np.array([0.5])):  # typed, not coerced: "False" would have ended the episode
        with pytest.raises(InvalidTransitionError, match="done is .*; it must hold bools"):
            buffer.add(stack, nxt, np.array([1]), np.array([0.5]), done, [{}])
    assert buffer.size() == 29
    buffer.add(stack, nxt, np.array([1]), np.array([0.5]), np.array([0.0], np.float32), [{}])  # (SB3's float dones)
    assert buffer.size() == 30

    # a store written by a run of 2 envs is not continued by a run of 3
    buffer.close()
    with pytest.raises(ConfigError, match="1 streams, one per env, but this run has 3 envs"):
        ReplayStoreBuffer(256, box, gym.spaces.Discrete(2), "cpu", n_envs=3, path=tmp_path / "c.zarr")
    with pytest.raises(ConfigError, match="not emptied in place"):
        ReplayStoreBuffer(256, box, gym.spaces.Discrete(2), "cpu", path=tmp_path / "c.zarr").reset()


def test_full_disk_is_a_clear_error_and_keeps_commits(tmp_path, tiny_disk):
    box = gym.spaces.Box(0, 255, (64, 64), np.uint8)
    buffer = ReplayStoreBuffer(200_000, box, gym.spaces.Discrete(2), "cpu", path=tiny_disk / "r.zarr")
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, size=(1, 64, 64), dtype=np.uint8)
    flushed = 0
    with pytest.raises(StoreWriteError, match="disk full|No space"):
        for t in range(100_000):
            nxt = rng.integers(0, 255, size=(1, 64, 64), dtype=np.uint8)  # incompressible: fills 2 MB fast
            buffer.add(obs, nxt, np.array([0]), np.array([1.0]), np.array([False]), [{}])
            obs = nxt
            if t % 50 == 49:
                buffer.flush()
                flushed = t + 1
    with ReplayStore.open(tiny_disk / "r.zarr") as store:
        assert len(store) >= flushed > 0


def lives_and_bonus(t: int) -> dict:
    """``lives`` every move, ``bonus`` every third move only."""
    return {"lives": np.int32(3 - t % 3), **({"bonus": np.array([t, -t], np.float32)} if t % 3 == 0 else {})}


def test_info_keys_are_kept_with_each_move(tmp_path):
    """``info_keys``: the infos SB3 hands ``add`` keep those keys as the store's extras (0 where an
    env's info lacks one); the buffer pickles them, a continued store keeps them, another list is refused."""
    path = str(tmp_path / "i.zarr")
    env = DummyVecEnv([lambda: Reporting(gym.make("CartPole-v1"), lives_and_bonus) for _ in range(2)])
    model = DQN("MlpPolicy", env, buffer_size=4_000, learning_starts=100, seed=0, device="cpu",
                replay_buffer_class=ReplayStoreBuffer,
                replay_buffer_kwargs={"path": path, "info_keys": {"lives": "int8", "bonus": ((2,), "float32")}})
    model.learn(600)
    store = model.replay_buffer.store
    assert [(e.name, e.dtype) for e in store.schema.extras] == [("lives", "int8"), ("bonus", "float32")]
    for episode in store.iter_episodes():  # SB3's infos of move t are those its step t returned
        t = episode.first_move + np.arange(1, len(episode) + 1)
        np.testing.assert_array_equal(episode.extras["lives"], 3 - t % 3)
        np.testing.assert_array_equal(episode.extras["bonus"][:, 0], np.where(t % 3 == 0, t, 0))
    clone = pickle.loads(pickle.dumps(model.replay_buffer))
    assert clone.side.info_keys == {"lives": "int8", "bonus": ((2,), "float32")}
    clone.side.close()
    model.replay_buffer.close()
    again = ReplayStoreBuffer(4_000, env.observation_space, env.action_space, device="cpu", n_envs=2, path=path)
    assert again.side.info_names == ("lives", "bonus")  # (adopted from the store)
    again.close()
    with pytest.raises(ConfigError, match=r"keeps the info keys \['lives', 'bonus'\], but info_keys names \['lives'\]"):
        ReplayStoreBuffer(4_000, env.observation_space, env.action_space, device="cpu", n_envs=2, path=path,
                          info_keys=["lives"])
    inferred = ReplayStoreBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=2,
                                 path=str(tmp_path / "n.zarr"), info_keys=["lives"])
    obs = np.zeros((2, 4), np.float32)
    inferred.add(obs, obs + 1, np.array([0, 1]), np.zeros(2), np.zeros(2), [{"lives": 2}, {"lives": 1}])
    assert [(e.name, e.dtype) for e in inferred.store.schema.extras] == [("lives", "int64")]
    with pytest.raises(InvalidTransitionError, match="infos is dict"):
        inferred.add(obs + 1, obs + 2, np.array([0, 1]), np.zeros(2), np.zeros(2), {"lives": 2})
    with pytest.raises(ConfigError, match="no env's first info holds it"):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=2,
                          path=str(tmp_path / "m.zarr"), info_keys=["gone"]).add(
            obs, obs + 1, np.array([0, 1]), np.zeros(2), np.zeros(2), [{}, {}])
    with pytest.raises(ConfigError, match="info_keys is 'lives'"):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, device="cpu", path=str(tmp_path / "s.zarr"),
                          info_keys="lives")
    inferred.close()
