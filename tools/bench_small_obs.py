"""Sampling small observations (CartPole-v1's 16 bytes): SB3's ``ReplayBuffer`` against ``ReplayStoreBuffer``.

Where a frame is a few bytes, decoding a batch costs per chunk, not per byte, so the store keeps
such a ring decoded in RAM (storage/mirror.py). This measures what that buys an SB3 user: the same
real CartPole-v1 transitions (random policy, one env) go into SB3's own buffer and into two
``ReplayStoreBuffer`` stores, one with the default ``cache_bytes`` (frames kept decoded) and one
with ``cache_bytes`` just below the decoded ring's threshold (every chunk still cached compressed,
decoded per batch, as before); then ``sample(64)`` (torch tensors, as SB3's DQN calls it) is timed
on each in interleaved rounds, one thread, after a warm-up that fills the caches:

    python tools/bench_small_obs.py [--steps 100000 500000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from harness import median, order, save  # noqa: E402

BATCH = 64


def record(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` CartPole-v1 moves under a random policy: obs, next_obs, action, reward, done."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs_l, next_l, act_l, rew_l, done_l = [], [], [], [], []
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        action = int(rng.integers(2))
        nxt, reward, terminated, truncated, _ = env.step(action)
        obs_l.append(obs), next_l.append(nxt), act_l.append(action), rew_l.append(reward)
        done_l.append(terminated or truncated)
        obs = env.reset()[0] if terminated or truncated else nxt
    return (np.asarray(obs_l, np.float32), np.asarray(next_l, np.float32), np.asarray(act_l),
            np.asarray(rew_l, np.float32), np.asarray(done_l))


def fill(buffer: object, data: tuple[np.ndarray, ...]) -> float:
    """Add every transition (as SB3's DQN does, one env); returns the seconds it took."""
    obs, nxt, act, rew, done = data
    start = time.perf_counter()
    for i in range(len(obs)):
        buffer.add(obs[i : i + 1], nxt[i : i + 1], act[i : i + 1], rew[i : i + 1], done[i : i + 1],  # type: ignore[attr-defined]
                   [{}])
    return time.perf_counter() - start


def rate(buffer: object, calls: int) -> float:
    """Milliseconds per ``sample(BATCH)``."""
    start = time.perf_counter()
    for _ in range(calls):
        buffer.sample(BATCH)  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[100_000, 500_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000, help="sample calls timed per contender and round")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import gymnasium as gym

    from replaystore.integrations.sb3 import buffer_class

    ReplayStoreBuffer = buffer_class()  # before SB3's own import: triton before tensorflow (sb3.py)
    from stable_baselines3.common.buffers import ReplayBuffer

    env = gym.make("CartPole-v1")
    space, actions = env.observation_space, env.action_space
    results: dict[str, dict] = {}
    for steps in args.steps:
        data = record(steps)
        decoded = -(-steps // 64) * 64 * space.shape[0] * 4  # the ring decoded: 64-frame chunks of 4 float32
        with tempfile.TemporaryDirectory() as tmp:
            buffers = {
                "SB3 ReplayBuffer": ReplayBuffer(steps, space, actions, "cpu", handle_timeout_termination=False),
                "ReplayStoreBuffer, frames kept decoded": ReplayStoreBuffer(
                    steps, space, actions, "cpu", handle_timeout_termination=False, path=os.path.join(tmp, "a.zarr")),
                "ReplayStoreBuffer, decoded per batch": ReplayStoreBuffer(
                    steps, space, actions, "cpu", handle_timeout_termination=False, path=os.path.join(tmp, "b.zarr"),
                    cache_bytes=2 * decoded - 1),
            }
            adds = {name: fill(buffer, data) for name, buffer in buffers.items()}
            for buffer in buffers.values():
                rate(buffer, 300)  # warm: the caches filled
            times: dict[str, list[float]] = {name: [] for name in buffers}
            for r in range(args.rounds):
                for name in order(list(buffers), r):
                    times[name].append(rate(buffers[name], args.calls))
            base = (median(times["SB3 ReplayBuffer"]))
            print(f"\n{steps:,} CartPole-v1 transitions, sample({BATCH}), {args.rounds} rounds (median)", flush=True)
            print(f"{'buffer':42s} {'ms per sample':>14s} {'x SB3':>7s} {'add us':>8s}")
            for name, ts in times.items():
                med = (median(ts))
                print(f"{name:42s} {med:14.3f} {med / base:7.2f} {adds[name] / steps * 1e6:8.1f}")
                results[f"{steps} {name}"] = {"ms_per_sample": ts, "median_ms": med, "x_sb3": med / base,
                                              "us_per_add": adds[name] / steps * 1e6}
            for buffer in buffers.values():
                if hasattr(buffer, "close"):
                    buffer.close()
    save(Path(args.json) if args.json else None, {"batch": BATCH, "results": results})


if __name__ == "__main__":
    main()
