"""What the Minari tests share (test_minari.py, test_minari_export.py): datasets that Minari itself
recorded (``minari.DataCollector``) or wrote (``create_dataset_from_buffers``), in a datasets root of
each test's own (conftest.py's ``datasets_root``). Import it after ``pytest.importorskip("minari")``."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector.episode_buffer import EpisodeBuffer

from replaystore import ReplayStore


def record(dataset_id: str, env: gym.Env, steps: int, *, seed: int = 0, record_infos: bool = False
           ) -> minari.MinariDataset:
    """``steps`` random moves of ``env`` recorded by Minari's own DataCollector (with the env's infos)."""
    collector = minari.DataCollector(env, record_infos=record_infos)
    collector.reset(seed=seed)
    collector.action_space.seed(seed)
    for _ in range(steps):
        _, _, terminated, truncated, _ = collector.step(collector.action_space.sample())
        if terminated or truncated:
            collector.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = collector.create_dataset(dataset_id, algorithm_name="random", author="tests", author_email="t@t",
                                           code_permalink="tests/test_minari.py", description="random play")
    collector.close()
    return dataset


def record_breakout_stacks(dataset_id: str, steps: int = 300) -> minari.MinariDataset:
    """What docs/trainer.md's offline examples learn from, small: random Breakout moves recorded
    behind ``FrameStackObservation(AtariPreprocessing(...), 4)`` (the docs' ``breakout/stacks-v0``),
    into ``MINARI_DATASETS_PATH`` (once: a page's later example finds it there)."""
    import ale_py

    if dataset_id in minari.list_local_datasets():
        return minari.load_dataset(dataset_id)
    gym.register_envs(ale_py)
    env = gym.wrappers.FrameStackObservation(
        gym.wrappers.AtariPreprocessing(gym.make("ALE/Breakout-v5", frameskip=1, max_num_frames_per_episode=800)), 4)
    return record(dataset_id, env, steps)


def record_breakout_frames(dataset_id: str, steps: int = 300) -> minari.MinariDataset:
    """Raw Breakout screens, ``(210, 160, 3)`` one a move, as Minari's hosted ``atari/*/expert-v0``
    datasets hold them (random moves, small), into ``MINARI_DATASETS_PATH``, once."""
    import ale_py

    if dataset_id in minari.list_local_datasets():
        return minari.load_dataset(dataset_id)
    gym.register_envs(ale_py)
    return record(dataset_id, gym.make("ALE/Breakout-v5", max_num_frames_per_episode=800), steps)


def written(dataset_id: str, episodes: list[dict], obs_space: gym.Space, action_space: gym.Space):
    """A dataset Minari writes from ``episodes`` as given (Minari checks none of the values)."""
    buffers = [EpisodeBuffer(observations=e["obs"], actions=e["action"], rewards=e["reward"],
                             terminations=e["terminated"], truncations=e["truncated"], infos={}) for e in episodes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return minari.create_dataset_from_buffers(dataset_id, buffers, observation_space=obs_space,
                                                  action_space=action_space, jpeg_encoding=False)


def episode(moves: int, *, start: float = 0.0, end: str = "terminated") -> dict:
    obs = (start + np.arange(moves + 1, dtype=np.float32))[:, None] * np.ones((1, 3), np.float32)
    flags = np.zeros(moves, bool)
    terminated, truncated = flags.copy(), flags.copy()
    if end == "terminated":
        terminated[-1] = True
    elif end == "truncated":
        truncated[-1] = True
    return {"obs": obs, "action": np.arange(moves) % 3, "reward": np.linspace(-1, 1, moves),
            "terminated": terminated, "truncated": truncated}


VECTOR = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)


def where(store: ReplayStore, dataset) -> dict[int, tuple[int, int]]:
    """Global store position -> (episode, move) of the dataset, for a store filled from it in order."""
    out, position = {}, 0
    for e, ep in enumerate(dataset.iterate_episodes()):
        for t in range(len(ep) + 1):
            out[position + t] = (e, t)
        position += len(ep) + 1
    return out


def left_beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}"))
