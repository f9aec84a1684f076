"""ReplayStoreBuffer's frames as Stable-Baselines3 hands them over: real SB3, real torch on the CPU,
real ALE.

Bit identity: every sampled observation and next observation (with its action, reward and done)
is a transition the agent saw, recorded independently here: SB3's VecFrameStack (zero padding)
over Breakout with several envs, life-loss ends and time limits, channels last and after
VecTransposeImage (channels first, as DQN's CnnPolicy sees it); gymnasium's FrameStackObservation
(reset padding); and a cleanrl-style gymnasium vector env with next-step autoreset.
"""

from __future__ import annotations

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecTransposeImage

from replaystore import ReplayStore
from replaystore.integrations.sb3 import ReplayStoreBuffer

gym.register_envs(ale_py)


def _breakout(max_steps: int = 60) -> gym.Env:
    env = gym.make("BreakoutNoFrameskip-v4")
    env = AtariWrapper(env, terminal_on_life_loss=True)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_steps)


def _drive(venv, buffer, steps: int, seed: int = 0) -> tuple[dict, int]:
    """Step ``venv`` with random actions as SB3's off-policy loop does, adding to ``buffer``;
    returns every transition seen, keyed by its observations' bytes, and the number of ends."""
    rng = np.random.default_rng(seed)
    seen: dict[bytes, set] = {}
    obs = venv.reset()
    ends = 0
    for _ in range(steps):
        actions = rng.integers(venv.action_space.n, size=venv.num_envs)
        new_obs, rewards, dones, infos = venv.step(actions)
        next_obs = new_obs.copy()
        for i, done in enumerate(dones):
            if done and infos[i].get("terminal_observation") is not None:
                next_obs[i] = infos[i]["terminal_observation"]
        buffer.add(obs, next_obs, actions, rewards, dones, infos)
        for i in range(venv.num_envs):
            timeout = infos[i].get("TimeLimit.truncated", False)
            seen.setdefault(obs[i].tobytes() + next_obs[i].tobytes(), set()).add(
                (int(actions[i]), float(rewards[i]), float(dones[i] and not timeout)))
        ends += int(dones.sum())
        obs = new_obs
    return seen, ends


def _check_samples(buffer, seen: dict, batches: int = 20, batch_size: int = 64) -> tuple[int, int]:
    """Every sample is a transition in ``seen``; returns (padded stacks sampled, distinct transitions)."""
    keys, padded = set(), 0
    for _ in range(batches):
        s = buffer.sample(batch_size)
        obs, nxt = s.observations.numpy(), s.next_observations.numpy()
        for j in range(batch_size):
            key = obs[j].tobytes() + nxt[j].tobytes()
            assert key in seen, "a sampled (obs, next_obs) the agent never saw"
            # (identical frames recur in Breakout: a pair of stacks may have been seen with several moves)
            assert (int(s.actions[j, 0]), float(s.rewards[j, 0]), float(s.dones[j, 0])) in seen[key]
            keys.add(key)
            padded += int(not obs[j].reshape(obs.shape[1], -1)[0].any()) if obs.shape[1] == 4 else 0
    return padded, len(keys)


@pytest.mark.parametrize("transpose", [False, True], ids=["channels-last", "channels-first"])
def test_vecframestack_breakout_bit_identical(tmp_path, transpose):
    venv = VecFrameStack(DummyVecEnv([_breakout] * 3), n_stack=4)
    if transpose:
        venv = VecTransposeImage(venv)
    venv.seed(1)
    buffer = ReplayStoreBuffer(100_000, venv.observation_space, venv.action_space, "cpu", n_envs=3,
                               path=tmp_path / "r.zarr")
    seen, ends = _drive(venv, buffer, 400)
    assert ends >= 10
    layout = buffer.side.stacks
    assert (layout.frame_stack, layout.padding, layout.axis) == (4, "zero", 0 if transpose else 2)
    assert buffer.store.schema.observation.shape == ((1, 84, 84) if transpose else (84, 84, 1))
    padded, distinct = _check_samples(buffer, seen)
    assert distinct > 500
    buffer.flush()
    # a reader of the store on disk rebuilds the same stacks: its frames are a quarter of the stacks
    with ReplayStore.open(tmp_path / "r.zarr") as store:
        assert store.schema.frame_padding == "zero" and len(store) == 3 * 400


def test_framestackobservation_reset_padding_bit_identical(tmp_path):
    def make() -> gym.Env:
        env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
        env = gym.wrappers.AtariPreprocessing(env, terminal_on_life_loss=True)
        return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(env, 50), 4, padding_type="reset")

    venv = DummyVecEnv([make] * 2)
    venv.seed(2)
    buffer = ReplayStoreBuffer(50_000, venv.observation_space, venv.action_space, "cpu", n_envs=2,
                               path=tmp_path / "r.zarr")
    seen, ends = _drive(venv, buffer, 300)
    assert ends >= 6
    layout = buffer.side.stacks
    assert (layout.frame_stack, layout.padding, layout.axis) == (4, "reset", 0)
    _, distinct = _check_samples(buffer, seen)
    assert distinct > 300


def test_cleanrl_style_next_step_autoreset(tmp_path):
    """A gymnasium vector env (next-step autoreset) driven as cleanrl's DQN does: the reset rows are
    recognised and not stored; truncations end episodes; what is sampled was seen."""
    def make() -> gym.Env:
        env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
        env = gym.wrappers.AtariPreprocessing(env, terminal_on_life_loss=True)
        return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(env, 30), 4)

    envs = gym.vector.SyncVectorEnv([make] * 2)
    rb = ReplayStoreBuffer(20_000, envs.single_observation_space, envs.single_action_space, "cpu",
                           n_envs=2, handle_timeout_termination=False, path=tmp_path / "r.zarr")
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    seen = {}
    prev_done = np.zeros(2, dtype=bool)
    for _ in range(200):
        actions = rng.integers(4, size=2)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        rb.add(obs, next_obs, actions, rewards, terminations, infos)
        for i in range(2):
            if not prev_done[i]:
                seen.setdefault(obs[i].tobytes() + next_obs[i].tobytes(), set()).add(
                    (int(actions[i]), float(rewards[i]), float(terminations[i])))
        prev_done = terminations | truncations
        obs = next_obs
    assert rb.side.skipped > 0
    _check_samples(rb, seen, batches=10)
