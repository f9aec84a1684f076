"""SB3's DQN on Breakout with a 1M-step buffer: its own ReplayBuffer against ReplayStoreBuffer.

Each contender runs in its own process (so peak RSS is its own), one after the other, in rounds
that alternate the order:

    python tools/bench_sb3.py [--steps 20000] [--rounds 1] [--json out.json]

Both use SB3's Atari setup: ``make_atari_env`` (AtariWrapper: 84x84 grey, frame skip 4, life-loss
ends), ``VecFrameStack(n_stack=4)``, ``DQN("CnnPolicy", buffer_size=1_000_000, train_freq=4,
gradient_steps=1, batch_size=32)``, the same seed. SB3's buffer runs with
``optimize_memory_usage=True`` (and ``handle_timeout_termination=False``, which that needs); its
arrays are allocated up front (``np.zeros``: pages are touched as they fill), so its RSS grows by
one 4-stack (28 KB) per step until the buffer holds 1M. The table gives, per contender, the env
steps/s of the whole ``learn`` (acting and training), the peak RSS at the end, what the buffer
holds, and SB3's memory warning where it gave one. ``--cartpole`` instead checks that both
buffers learn CartPole-v1 (mean return of 20 greedy episodes >= 195 within 100k steps), with
rl-baselines3-zoo's hyperparameters, one run per seed (``--seeds 0 1 2``). ``--pendulum``: both
buffers under SAC on Pendulum-v1 (Box actions; rl-baselines3-zoo's learning rate 1e-3, the rest SB3's
defaults), the mean return of 10 deterministic episodes every 2k steps up to ``--steps``, and the
wall time of the whole run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import child, median, order, save  # noqa: E402

CHILD = r"""
import json, os, sys, time, warnings
from harness import report
from replaystore.integrations.sb3 import ReplayStoreBuffer  # first: loads triton before tensorflow (sb3.py)
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack
import ale_py, gymnasium as gym
gym.register_envs(ale_py)
which, steps, learning_starts, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
buffer_size = int(sys.argv[5])
env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=1, seed=0), n_stack=4)
kwargs = dict(buffer_size=buffer_size, learning_starts=learning_starts, train_freq=4, gradient_steps=1,
              batch_size=32, seed=0, device="cpu", verbose=0)
if which == "sb3":
    kwargs.update(optimize_memory_usage=True, replay_buffer_kwargs={"handle_timeout_termination": False})
else:
    kwargs.update(replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"path": path})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        model = DQN("CnnPolicy", env, **kwargs)
    except MemoryError as exc:
        print(json.dumps({"which": which, "buffer_size": buffer_size, "failed": f"{type(exc).__name__}: {exc}"}))
        sys.exit(0)
warning = next((str(w.message) for w in caught if "memory" in str(w.message)), None)
rb = model.replay_buffer
allocated = sum(getattr(rb, name).nbytes for name in ("observations", "next_observations", "actions", "rewards",
                                                         "dones", "timeouts") if hasattr(rb, name))
start = time.perf_counter()
model.learn(steps)
took = time.perf_counter() - start
held = rb.size() if which != "sb3" else (rb.buffer_size if rb.full else rb.pos) * rb.n_envs
disk = 0
if which != "sb3":
    rb.flush()
    for root, _, files in os.walk(path):
        disk += sum(os.path.getsize(os.path.join(root, f)) for f in files)
report({"which": which, "buffer_size": buffer_size, "steps": model.num_timesteps, "updates": model._n_updates,
        "seconds": took, "env_sps": model.num_timesteps / took, "held": held, "allocated_bytes": allocated,
        "disk_bytes": disk, "warning": warning})
"""

CARTPOLE = r"""
import json, sys, time
import numpy as np
from replaystore.integrations.sb3 import ReplayStoreBuffer  # first: loads triton before tensorflow (sb3.py)
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy
import gymnasium as gym
which, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
# rl-baselines3-zoo's tuned CartPole-v1 DQN hyperparameters
kwargs = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000, gamma=0.99,
              target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
              exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu")
if which != "sb3":
    kwargs.update(replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"path": path})
model = DQN("MlpPolicy", "CartPole-v1", **kwargs)
curve, start = [], time.perf_counter()
for k in range(1, 11):
    model.learn(10_000, reset_num_timesteps=False)
    mean, _ = evaluate_policy(model, gym.make("CartPole-v1"), n_eval_episodes=20, deterministic=True)
    curve.append([model.num_timesteps, float(mean)])
print(json.dumps({"which": which, "seed": seed, "curve": curve, "seconds": time.perf_counter() - start,
                  "first_195": next((s for s, m in curve if m >= 195), None)}))
"""


PENDULUM = r"""
import json, sys, time
from replaystore.integrations.sb3 import ReplayStoreBuffer  # first: loads triton before tensorflow (sb3.py)
from stable_baselines3 import SAC
from stable_baselines3.common.evaluation import evaluate_policy
import gymnasium as gym
which, path, seed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kwargs = dict(learning_rate=1e-3, seed=seed, device="cpu")
if which != "sb3":
    kwargs.update(replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"path": path})
model = SAC("MlpPolicy", "Pendulum-v1", **kwargs)
curve, start = [], time.perf_counter()
while model.num_timesteps < steps:
    model.learn(2_000, reset_num_timesteps=False)
    mean, _ = evaluate_policy(model, gym.make("Pendulum-v1"), n_eval_episodes=10, deterministic=True)
    curve.append([model.num_timesteps, round(float(mean), 1)])
print(json.dumps({"which": which, "seed": seed, "curve": curve, "seconds": time.perf_counter() - start,
                  "updates": model._n_updates}))
"""


def run_child(code: str, args: list[str]) -> dict:
    return child(args, code=code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--learning-starts", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sb3-fallback", type=int, default=200_000,
                    help="SB3's buffer size when 1M cannot be allocated (for the speed comparison)")
    ap.add_argument("--cartpole", action="store_true", help="check that both buffers learn CartPole-v1 instead")
    ap.add_argument("--pendulum", action="store_true", help="SAC on Pendulum-v1 (Box actions) with both buffers instead")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="--cartpole, --pendulum: the seeds to run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results: list[dict] = []
    failures: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for which in order(["sb3", "replaystore"], r):
                path = os.path.join(tmp, f"{which}-{r}.zarr")
                if args.pendulum:
                    for seed in args.seeds:
                        res = run_child(PENDULUM, [which, f"{path}-{seed}", str(seed), str(args.steps)])
                        print(f"{which:12s} seed {seed}  curve {res['curve']}  {res['updates']} updates  "
                              f"{res['seconds']:.0f} s", flush=True)
                        results.append(res)
                    continue
                if args.cartpole:
                    for seed in args.seeds:
                        res = run_child(CARTPOLE, [which, f"{path}-{seed}", str(seed)])
                        print(f"{which:12s} seed {seed}  first >= 195 at {res['first_195']}  curve {res['curve']}  "
                              f"{res['seconds']:.0f} s", flush=True)
                        results.append(res)
                    continue
                res = run_child(CHILD, [which, str(args.steps), str(args.learning_starts), path, "1000000"])
                if "failed" in res:
                    print(f"{which:12s} buffer_size 1,000,000: {res['failed']}", flush=True)
                    failures.append(res)
                    res = run_child(CHILD, [which, str(args.steps), str(args.learning_starts), path,
                                            str(args.sb3_fallback)])
                print(f"{which:12s} buffer {res['buffer_size']:>9,}  {res['env_sps']:7.1f} env steps/s  {res['updates']:6d} updates  "
                      f"peak RSS {res['peak_rss_mb']:7.0f} MB  holds {res['held']:,}  "
                      f"disk {res['disk_bytes'] / 2**20:.1f} MB  allocated {res['allocated_bytes'] / 1e9:.1f} GB",
                      flush=True)
                results.append(res)
    if args.pendulum:
        took = {w: sum(r["seconds"] for r in results if r["which"] == w) for w in ("sb3", "replaystore")}
        print(f"\nwall time replaystore / sb3: {took['replaystore'] / took['sb3']:.2f}")
    elif not args.cartpole:
        by = {w: [r for r in results if r["which"] == w] for w in ("sb3", "replaystore")}
        sps = {w: median(r["env_sps"] for r in rs) for w, rs in by.items()}
        rss = {w: max(r["peak_rss_mb"] for r in rs) for w, rs in by.items()}
        per_step = 4 * 84 * 84  # SB3's optimize_memory_usage buffer: one 4-stack per step, touched as it fills
        print(f"\nenv steps/s replaystore / sb3: {sps['replaystore'] / sps['sb3']:.2f}")
        print(f"peak RSS at {args.steps:,} steps: sb3 {rss['sb3']:.0f} MB, replaystore {rss['replaystore']:.0f} MB")
        print(f"sb3's buffer at 1M steps: {1_000_000 * per_step / 1e9:.1f} GB of observations on top of the process "
              f"(warning: {by['sb3'][0]['warning']!r}; at 1M: {failures[0]['failed'] if failures else 'allocated'})")
    save(Path(args.json) if args.json else None, {"steps": args.steps, "results": results, "failures": failures})


if __name__ == "__main__":
    main()
