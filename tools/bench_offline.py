"""Learning offline (``DQN.fit_offline``): does it learn, and what does it cost in RAM.

**Learning** (``--part learn``). Three CartPole datasets of ``--moves`` moves each, written into
stores by a heuristic policy (push the cart the way the pole falls: ~500 alone) with a share of its
moves random: 1.0 ("random"), 0.5 ("noisy") and 0.1 ("expert", which covers few states). On each,
plain DQN and conservative Q-learning (``cql_alpha=1``) learn for ``--steps`` gradient steps from
``--seeds`` seeds; the table gives the dataset's own mean return and each learner's mean greedy
return over 20 games (per seed, and their mean). Keras runs on ``KERAS_BACKEND`` (JAX is the
quicker here for a small MLP).

**RAM on Atari** (``--part ram``). The Minari dataset of 100,000 Breakout moves that
tools/bench_minari.py records (``(4, 84, 84)`` stacks, 2.9 GB of HDF5) is learned from with a
Nature CNN on TensorFlow, ``--atari-steps`` gradient steps, each way in its own process (peak RSS
is ``VmHWM``):

- **store**: ``store_from_minari`` once (not timed here: bench_minari times it), then
  ``DQN(nature_cnn, store).fit_offline``, which samples the compressed store;
- **in RAM**: the way a learner without the store does it: every episode's observations read into
  RAM from the dataset (``iterate_episodes``: each episode's T + 1 stacks, so the least a stacked
  dataset can take without taking the stacks apart), batches drawn from them with NumPy, and the
  same learner (``make_learner``, the same compiled call of 8 steps) trained on them.

Gradient steps a second are measured after the first call (the compilation). On this CPU the
network bounds both; the figure that differs is the RAM.

    python tools/bench_offline.py [--part learn|ram|all] [--json tools/out/bench_offline.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from harness import child, save  # noqa: E402

OUT = Path(__file__).parent / "out"
DATASETS = {"random": 1.0, "noisy": 0.5, "expert": 0.1}
MINARI_ID = "bench/breakout-stacks-v0"  # what tools/bench_minari.py records under tools/out/minari_<steps>


def heuristic(obs: np.ndarray) -> int:
    return int(obs[2] + 0.5 * obs[3] > 0)


def write_dataset(path: str | Path, moves: int, random_share: float, seed: int) -> float:
    """A CartPole store of the heuristic's moves, ``random_share`` of them random; its mean return."""
    import gymnasium as gym

    from replaystore import ReplayStore

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    returns, ret = [], 0.0
    with ReplayStore.create(path, moves, env.observation_space, env.action_space, 1) as store:
        obs, _ = env.reset(seed=seed)
        for _ in range(moves):
            action = int(rng.integers(2)) if rng.random() < random_share else heuristic(obs)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            store.add(obs, action, reward, next_obs, terminated, truncated)
            ret += float(reward)
            obs = next_obs
            if terminated or truncated:
                returns.append(ret)
                ret, (obs, _) = 0.0, env.reset()
    return float(np.mean(returns)) if returns else float("nan")


def learn(args: argparse.Namespace) -> dict:
    import gymnasium as gym
    import keras

    from replaystore.trainer import DQN, mlp

    results: dict = {"backend": keras.backend.backend(), "moves": args.moves, "steps": args.steps, "datasets": {}}
    print(f"CartPole, {args.moves:,} moves a dataset, {args.steps:,} gradient steps, Keras on "
          f"{results['backend']}; greedy return over 20 games")
    print("| dataset | its return | DQN (per seed) | DQN | CQL (per seed) | CQL |\n|---|---|---|---|---|---|")
    for name, share in DATASETS.items():
        path = OUT / f"bench_offline_cartpole_{name}_{args.moves}.zarr"
        if path.exists():
            import shutil

            shutil.rmtree(path)
        data_return = write_dataset(path, args.moves, share, seed=0)
        row: dict = {"data_return": data_return}
        for label, alpha in (("dqn", 0.0), ("cql", 1.0)):
            returns, seconds = [], []
            for seed in range(args.seeds):
                keras.utils.set_random_seed(seed)
                agent = DQN(mlp((1, 4), 2, hidden_sizes=(64, 64)), path, batch_size=64, train_frequency=1,
                            target_network_frequency=500, learning_rate=1e-3, n_step=1, cql_alpha=alpha, seed=seed + 1,
                            sample_threads=1)
                t0 = time.perf_counter()
                agent.fit_offline(args.steps)
                seconds.append(time.perf_counter() - t0)
                returns.append(float(np.mean(agent.evaluate(gym.make("CartPole-v1"), episodes=20, seed=1000 + seed))))
                agent.close()
            row[label] = {"returns": returns, "mean": float(np.mean(returns)), "fit_s": seconds}
        results["datasets"][name] = row
        print(f"| {name} ({share:.0%} random) | {data_return:.0f} | "
              f"{', '.join(f'{r:.0f}' for r in row['dqn']['returns'])} | **{row['dqn']['mean']:.0f}** | "
              f"{', '.join(f'{r:.0f}' for r in row['cql']['returns'])} | **{row['cql']['mean']:.0f}** |", flush=True)
    return results


CHILD = r"""
import json, os, sys, time
import numpy as np
from harness import report
import keras
from replaystore.trainer import nature_cnn

how, store_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
K, BATCH = 8, 32
times = []

class Timer(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        times.append(time.perf_counter())

keras.utils.set_random_seed(0)
model = nature_cnn((4, 84, 84), 4)
t_start = time.perf_counter()
if how == "store":
    from replaystore.trainer import DQN
    agent = DQN(model, store_path, cql_alpha=1.0, steps_per_call=K, sample_threads=2)
    agent.fit_offline(steps, callbacks=[Timer()])
    loaded_s = None
else:
    import minari
    from replaystore.trainer.learner import make_learner
    dataset = minari.load_dataset(os.environ["DATASET_ID"])
    episodes = [(ep.observations, ep.actions, ep.rewards, ep.terminations) for ep in dataset.iterate_episodes()]
    loaded_s = time.perf_counter() - t_start
    lengths = np.array([len(e[1]) for e in episodes])
    owner = np.repeat(np.arange(len(episodes)), lengths)
    offset = np.concatenate([np.arange(n) for n in lengths])
    learner = make_learner(model, keras.optimizers.Adam(1e-4, global_clipnorm=10.0), stack_shape=(4, 84, 84),
                           dtype="uint8", target_every=250, tau=1.0, cql_alpha=1.0)
    rng = np.random.default_rng(0)
    block = {"obs": np.empty((K, BATCH, 4, 84, 84), np.uint8), "next_obs": np.empty((K, BATCH, 4, 84, 84), np.uint8),
             "action": np.empty((K, BATCH), np.int64), "reward": np.empty((K, BATCH), np.float32),
             "discount": np.empty((K, BATCH), np.float32), "weight": np.ones((K, BATCH), np.float32)}
    while learner.train_steps < steps:
        rows = rng.integers(0, owner.size, (K, BATCH))
        for k in range(K):
            for b in range(BATCH):
                obs, actions, rewards, terms = episodes[owner[rows[k, b]]]
                t = offset[rows[k, b]]
                block["obs"][k, b], block["next_obs"][k, b] = obs[t], obs[t + 1]
                block["action"][k, b], block["reward"][k, b] = actions[t], rewards[t]
                block["discount"][k, b] = 0.0 if terms[t] else 0.99
        learner.train_block(block)
        times.append(time.perf_counter())
rate = (len(times) - 1) * K / (times[-1] - times[0])
report({"steps_per_s": rate, "load_s": loaded_s, "total_s": time.perf_counter() - t_start})
"""


def ram(args: argparse.Namespace) -> dict:
    root = OUT / f"minari_{args.atari_moves}"
    data = root / MINARI_ID
    if not data.exists():
        raise SystemExit(f"{data} is missing: record it first with python tools/bench_minari.py --steps "
                         f"{args.atari_moves}")
    env = {**os.environ, "MINARI_DATASETS_PATH": str(root), "DATASET_ID": MINARI_ID, "KERAS_BACKEND": "tensorflow"}
    store = OUT / f"bench_offline_breakout_{args.atari_moves}.zarr"
    if not store.exists():
        subprocess.run([sys.executable, "-m", "replaystore.cli", "import-minari", MINARI_ID, str(store)], env=env,
                       check=True)
    dataset_mb = sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) / 2**20
    store_mb = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 2**20
    results: dict = {"moves": args.atari_moves, "steps": args.atari_steps, "dataset_mb": dataset_mb,
                     "store_mb": store_mb}
    for how in ("store", "ram"):
        results[how] = child([how, str(store), str(args.atari_steps)], code=CHILD, env=env)
    s, r = results["store"], results["ram"]
    print(f"\nBreakout, {args.atari_moves:,} moves of (4, 84, 84) stacks (Minari HDF5 {dataset_mb:,.0f} MB, "
          f"store {store_mb:,.1f} MB); Nature CNN + CQL on TensorFlow, {args.atari_steps} gradient steps")
    print("| learning from | peak RSS | gradient steps/s | loading |\n|---|---|---|---|")
    print(f"| the store (fit_offline) | **{s['peak_rss_mb']:,.0f} MB** | {s['steps_per_s']:.1f} | none |")
    print(f"| the dataset in RAM | **{r['peak_rss_mb']:,.0f} MB** | {r['steps_per_s']:.1f} | {r['load_s']:.1f} s |")
    print(f"RAM ratio (in RAM / store): {r['peak_rss_mb'] / s['peak_rss_mb']:.1f}x; speed ratio (store / in RAM): "
          f"{s['steps_per_s'] / r['steps_per_s']:.2f}")
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("learn", "ram", "all"), default="all")
    ap.add_argument("--moves", type=int, default=20_000, help="CartPole moves a dataset")
    ap.add_argument("--steps", type=int, default=5_000, help="gradient steps on CartPole")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--atari-moves", type=int, default=100_000, help="the Minari dataset bench_minari recorded")
    ap.add_argument("--atari-steps", type=int, default=160, help="gradient steps on Breakout")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    results = {}
    if args.part in ("learn", "all"):
        results["learn"] = learn(args)
    if args.part in ("ram", "all"):
        results["ram"] = ram(args)
    save(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
