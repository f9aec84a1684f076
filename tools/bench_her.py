"""Hindsight experience replay: SB3's ``HerReplayBuffer`` against ``ReplayStoreHerBuffer``, side by side.

1. **Sampling.** The transitions of bench_dict_obs.py (FetchReach's shapes, 50-move episodes, a
   random walk) added to both buffers as SAC adds them, one env, then ``sample(256)`` (80% of it
   relabelled with ``future`` goals, rewards from the env's ``compute_reward``) timed in interleaved
   rounds; also ``store.sample(256, sampler=HindsightSampler(...))``, the store's own call without
   torch. It prints ms per sample, its ratio to SB3's, us per ``add`` and what each buffer holds.
2. **Learning** (``--learn``). DQN on bit flipping (tests/goal_env.py ``BitFlip``: HER's own
   sparse-reward task) with each buffer, and with SB3's plain buffer (no relabelling), the same
   seed and settings: wall time and the share of 100 greedy episodes that reach the goal.
3. **Episode lengths** (``--lengths 50 1000``): 200,000 transitions of AntMaze's shapes
   (``observation`` float64 (27,), goals float64 (2,)) in episodes of each length, added to both
   buffers, then ``sample(256)`` of each and ``store.sample(256)`` with and without relabelling,
   interleaved rounds: what a draw costs as the episodes grow.
4. **A robot arm** (``--fetch``, needs ``pip install gymnasium-robotics 'mujoco<3.3'``): SAC on
   gymnasium-robotics' ``FetchReach-v4`` (MuJoCo, sparse reward) with each HER buffer,
   rl-baselines3-zoo's settings for it, the success rate of 20 deterministic episodes every
   ``--fetch-every`` steps, and the wall time.

    python tools/bench_her.py [--steps 100000 1000000] [--learn] [--bits 8 15] [--lengths 50 1000] [--fetch]
                              [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_dict_obs import BATCH, fill, holds, rate, record, save, spaces  # noqa: E402
from harness import median, order  # noqa: E402


class Walk:
    """The goal env the random walk stands for: only its ``compute_reward`` is called (by the
    buffers, through ``env_method``), so it is a gymnasium env that does nothing else."""

    @staticmethod
    def make() -> object:
        import gymnasium as gym

        class WalkEnv(gym.Env):
            def __init__(self) -> None:
                self.observation_space, self.action_space = spaces()

            def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
                return self.observation_space.sample(), {}

            def step(self, action: object) -> tuple:
                return self.observation_space.sample(), 0.0, False, False, {}

            def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
                return -np.linalg.norm(achieved - desired, axis=-1).astype(np.float32)

        return WalkEnv()


def sampling(args: argparse.Namespace, results: dict) -> None:
    from replaystore.integrations.sb3 import her_buffer_class

    ReplayStoreHerBuffer = her_buffer_class()  # before SB3's own import: triton before tensorflow (sb3.py)
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    from replaystore import HindsightSampler

    space, actions = spaces()
    env = DummyVecEnv([Walk.make])
    for steps in args.steps:
        data = record(steps)
        with tempfile.TemporaryDirectory() as tmp:
            kw = {"handle_timeout_termination": False, "n_sampled_goal": 4, "goal_selection_strategy": "future"}
            sb3 = HerReplayBuffer(steps, space, actions, env, "cpu", **kw)
            ours = ReplayStoreHerBuffer(steps, space, actions, env, "cpu", **kw, path=os.path.join(tmp, "her.zarr"))
            adds = {"SB3 HerReplayBuffer": fill(sb3, data, False), "ReplayStoreHerBuffer": fill(ours, data, False)}
            compute = env.envs[0].compute_reward  # type: ignore[attr-defined]
            sampler = HindsightSampler(compute, n_sampled_goal=4).bind(ours.store.schema)
            store = ours.store

            class Direct:  # the store's own call: numpy out, no torch
                def sample(self, n: int) -> object:
                    return store.sample(n, sampler=sampler)

            contenders = {"SB3 HerReplayBuffer": sb3, "ReplayStoreHerBuffer": ours,
                          "store.sample(sampler=Hindsight)": Direct()}
            for buffer in contenders.values():
                rate(buffer, 50)  # warm: the caches filled
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for r in range(args.rounds):
                for name in order(list(contenders), r):
                    times[name].append(rate(contenders[name], args.calls))
            base = (median(times["SB3 HerReplayBuffer"]))
            print(f"\n{steps:,} transitions of FetchReach's shapes, sample({BATCH}) with 80% relabelled (future), "
                  f"{args.rounds} rounds (median)", flush=True)
            print(f"{'buffer':34s} {'ms per sample':>14s} {'x SB3':>7s} {'add us':>8s}  holds")
            for name, ts in times.items():
                med = (median(ts))
                held = holds(contenders[name]) if name in adds else "(the store above)"
                add = f"{adds[name] / steps * 1e6:8.1f}" if name in adds else f"{'':8s}"
                print(f"{name:34s} {med:14.3f} {med / base:7.2f} {add}  {held}")
                results[f"sample {steps} {name}"] = {"ms_per_sample": ts, "median_ms": med, "x_sb3": med / base,
                                                     "us_per_add": adds[name] / steps * 1e6 if name in adds else None,
                                                     "holds": held}
            ours.close()


def lengths(args: argparse.Namespace, results: dict) -> None:
    from replaystore.integrations.sb3 import her_buffer_class

    ReplayStoreHerBuffer = her_buffer_class()
    import gymnasium as gym
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    from replaystore import HindsightSampler

    box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
    space = gym.spaces.Dict({"observation": box(27), "achieved_goal": box(2), "desired_goal": box(2)})
    actions = gym.spaces.Box(-1, 1, (8,), np.float32)
    env = DummyVecEnv([Walk.make])
    steps = 200_000
    print(f"\n{steps:,} transitions of AntMaze's shapes in episodes of each length, sample({BATCH}), "
          f"{args.rounds} rounds (median ms)", flush=True)
    print(f"{'moves an episode':>16s} {'SB3 HER':>9s} {'ours HER':>9s} {'store HER':>10s} {'store uniform':>14s}")
    rng = np.random.default_rng(0)
    for length in args.lengths:
        with tempfile.TemporaryDirectory() as tmp:
            kw = {"handle_timeout_termination": False, "n_sampled_goal": 4, "goal_selection_strategy": "future"}
            sb3 = HerReplayBuffer(steps, space, actions, env, "cpu", **kw)
            ours = ReplayStoreHerBuffer(steps, space, actions, env, "cpu", **kw, path=os.path.join(tmp, "l.zarr"))
            walk = np.cumsum(0.05 * rng.normal(size=(steps + 1, 27)), axis=0)
            goals = rng.normal(size=(steps // length + 1, 2))
            action = np.zeros((1, 8), np.float32)
            for i in range(steps):
                goal = goals[i // length][None]
                o = {"observation": walk[i : i + 1], "achieved_goal": walk[i : i + 1, :2], "desired_goal": goal}
                n = {"observation": walk[i + 1 : i + 2], "achieved_goal": walk[i + 1 : i + 2, :2], "desired_goal": goal}
                done = np.array([i % length == length - 1])
                for buffer in (sb3, ours):
                    buffer.add(o, n, action, np.zeros(1, np.float32), done, [{}])
            store = ours.store
            sampler = HindsightSampler(env.envs[0].compute_reward).bind(store.schema)  # type: ignore[attr-defined]

            class Direct:
                def __init__(self, relabel: bool) -> None:
                    self.relabel = relabel

                def sample(self, n: int) -> object:
                    return store.sample(n, sampler=sampler) if self.relabel else store.sample(n)

            contenders = {"SB3 HER": sb3, "ours HER": ours, "store HER": Direct(True), "store uniform": Direct(False)}
            for c in contenders.values():
                rate(c, 30)
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for r in range(args.rounds):
                for name in order(list(contenders), r):
                    times[name].append(rate(contenders[name], args.calls))
            med = {name: (median(ts)) for name, ts in times.items()}
            print(f"{length:16,d} {med['SB3 HER']:9.3f} {med['ours HER']:9.3f} {med['store HER']:10.3f} "
                  f"{med['store uniform']:14.3f}", flush=True)
            results[f"lengths {length}"] = {"ms_per_sample": times, "median_ms": med}
            ours.close()


def learning(args: argparse.Namespace, results: dict) -> None:
    from replaystore.integrations.sb3 import her_buffer_class

    ReplayStoreHerBuffer = her_buffer_class()
    from goal_env import BitFlip
    from stable_baselines3 import DQN, HerReplayBuffer

    print("\nDQN on bit flipping: the same seed and settings, greedy success over 100 episodes", flush=True)
    print(f"{'bits':>4s} {'steps':>7s} {'buffer':22s} {'seconds':>8s} {'success':>8s}")
    for bits, steps in zip(args.bits, args.learn_steps):
        for name in ("ReplayStoreHerBuffer", "SB3 HerReplayBuffer", "SB3 ReplayBuffer"):
            with tempfile.TemporaryDirectory() as tmp:
                env = BitFlip(bits)
                cls, kw = {"ReplayStoreHerBuffer": (ReplayStoreHerBuffer, {"path": os.path.join(tmp, "h.zarr")}),
                           "SB3 HerReplayBuffer": (HerReplayBuffer, {}), "SB3 ReplayBuffer": (None, None)}[name]
                if kw is not None:
                    kw.update(n_sampled_goal=4, goal_selection_strategy="future")
                model = DQN("MultiInputPolicy", env, replay_buffer_class=cls, replay_buffer_kwargs=kw, seed=0,
                            learning_starts=200, buffer_size=100_000, exploration_fraction=0.5,
                            exploration_final_eps=0.05, learning_rate=1e-3, target_update_interval=500, batch_size=64,
                            gamma=0.95, policy_kwargs={"net_arch": [128, 128]}, device="cpu")
                start = time.perf_counter()
                model.learn(steps)
                seconds = time.perf_counter() - start
                wins = 0
                for ep in range(100):
                    obs, _ = env.reset(seed=10_000 + ep)
                    for _ in range(bits):
                        obs, _, terminated, truncated, _ = env.step(model.predict(obs, deterministic=True)[0])
                        if terminated or truncated:
                            wins += int(terminated)
                            break
                print(f"{bits:4d} {steps:7,d} {name:22s} {seconds:8.1f} {wins / 100:8.2f}", flush=True)
                results[f"learn {bits} {name}"] = {"steps": steps, "seconds": seconds, "success": wins / 100}


def fetch(args: argparse.Namespace, results: dict) -> None:
    from replaystore.integrations.sb3 import her_buffer_class

    ReplayStoreHerBuffer = her_buffer_class()
    import gymnasium as gym
    import gymnasium_robotics
    from stable_baselines3 import SAC, HerReplayBuffer
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize, sync_envs_normalization

    gym.register_envs(gymnasium_robotics)
    print(f"\nSAC + HER on FetchReach-v4 (zoo settings: observations normalized), success of 20 deterministic "
          f"episodes every {args.fetch_every:,} steps", flush=True)

    def make() -> object:
        return VecNormalize(DummyVecEnv([lambda: gym.make("FetchReach-v4")]), norm_reward=False, gamma=0.95)

    class Evaluate(BaseCallback):
        """The success rate of 20 deterministic episodes on an env of its own (the training env's
        normalization copied in), with the time since the start."""

        def __init__(self) -> None:
            super().__init__()
            self.curve: list[tuple[int, float, float]] = []
            self.start = time.perf_counter()
            self.env = make()
            self.env.training = False  # type: ignore[attr-defined]
            self.env.seed(50_000)  # type: ignore[attr-defined]

        def _on_step(self) -> bool:
            if self.num_timesteps % args.fetch_every == 0:
                sync_envs_normalization(self.training_env, self.env)
                wins = 0
                for _ in range(20):
                    obs = self.env.reset()  # type: ignore[attr-defined]
                    for _ in range(50):
                        obs, _, done, infos = self.env.step(self.model.predict(obs, deterministic=True)[0])  # type: ignore[attr-defined]
                        if done[0]:
                            break
                    wins += int(infos[0].get("is_success", 0.0) > 0)
                self.curve.append((self.num_timesteps, wins / 20, time.perf_counter() - self.start))
            return True

    for name in ("ReplayStoreHerBuffer", "SB3 HerReplayBuffer"):
        with tempfile.TemporaryDirectory() as tmp:
            cls, kw = ((ReplayStoreHerBuffer, {"path": os.path.join(tmp, "fetch.zarr")}) if name.startswith("Replay")
                       else (HerReplayBuffer, {}))
            kw.update(goal_selection_strategy="future", n_sampled_goal=4)
            model = SAC("MultiInputPolicy", make(), replay_buffer_class=cls, replay_buffer_kwargs=kw,
                        buffer_size=1_000_000, batch_size=256, gamma=0.95, learning_rate=1e-3, learning_starts=1000,
                        policy_kwargs={"net_arch": [64, 64], "n_critics": 1}, seed=0, device="cpu")
            callback = Evaluate()
            start = time.perf_counter()
            model.learn(args.fetch_steps, callback=callback)
            seconds = time.perf_counter() - start
            curve = ", ".join(f"{s:.2f}" for _, s, _ in callback.curve)
            print(f"{name:22s} success at every {args.fetch_every:,} steps: {curve}; {seconds:.0f} s in all", flush=True)
            results[f"fetch {name}"] = {"curve": callback.curve, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300, help="sample calls timed per contender and round")
    ap.add_argument("--learn", action="store_true", help="also the bit-flipping runs")
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 15])
    ap.add_argument("--learn-steps", type=int, nargs="+", default=[5_000, 15_000])
    ap.add_argument("--lengths", type=int, nargs="*", default=[], help="episode lengths to time sampling at")
    ap.add_argument("--fetch", action="store_true", help="also SAC on FetchReach-v4 (needs gymnasium-robotics)")
    ap.add_argument("--fetch-steps", type=int, default=10_000)
    ap.add_argument("--fetch-every", type=int, default=1_000)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    if args.steps:
        sampling(args, results)
    if args.lengths:
        lengths(args, results)
    if args.learn:
        learning(args, results)
    if args.fetch:
        fetch(args, results)
    save(args.json, results)


if __name__ == "__main__":
    main()
