"""The quick start's main job (until the DQN trainer lands): play real Breakout into a replay store.

A random policy plays ALE/Breakout-v5 through AtariPreprocessing (84x84 gray frames) for --steps
transitions into runs/quickstart/replay.zarr, then the store is reopened read-only and summarised:
its format, layout, what it holds, bytes on disk, and a sampled batch of 4-frame stacks.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np

from replaystore import FORMAT_VERSION, ReplayStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--store", type=Path, default=Path("runs/quickstart/replay.zarr"))
    args = ap.parse_args()

    gym.register_envs(ale_py)
    env = gym.wrappers.AtariPreprocessing(gym.make("ALE/Breakout-v5", frameskip=1))
    t0 = time.perf_counter()
    with ReplayStore.create(args.store, capacity=8192, observation_space=env.observation_space,
                            action_space=env.action_space, frame_stack=4, overwrite=True) as store:
        obs, _ = env.reset(seed=0)
        for _ in range(args.steps):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            store.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs if not (terminated or truncated) else env.reset()[0]
    elapsed = time.perf_counter() - t0

    store = ReplayStore.open(args.store)
    state = store.committed
    on_disk = sum(p.stat().st_size for p in args.store.rglob("*") if p.is_file())
    raw = store.added * int(np.prod(store.schema.observation.shape))
    batch = store.sample(32, rng=np.random.default_rng(0))
    print(f"played {args.steps} Breakout steps into {args.store} in {elapsed:.1f} s")
    print(f"  format version   {FORMAT_VERSION}, capacity {store.capacity} steps, frame_stack {store.frame_stack}")
    print(f"  layout           shards of {store.layout.shard_len} steps, frame chunks of {store.layout.obs_chunk_len}, "
          f"{store.layout.codec.name}-{store.layout.codec.level} + crc32c")
    print(f"  committed state  added={state.added} oldest={state.oldest} episodes={state.episodes} "
          f"episode_in_progress={state.episode_in_progress}")
    print(f"  transitions      {len(store)} sampleable")
    print(f"  on disk          {on_disk / 1e6:.2f} MB ({raw / max(on_disk, 1):.0f}x smaller than raw frames)")
    print(f"  sampled batch    obs {batch.obs.shape} {batch.obs.dtype}, next_obs {batch.next_obs.shape}, "
          f"rewards {batch.reward.sum():.0f}, terminated {int(batch.terminated.sum())}")


if __name__ == "__main__":
    main()
