"""Acting with N environments into one store: what writing costs the actors.

For N = 1, 2, 4, 8 envs of ale-py's C++ ``AtariVectorEnv`` (Breakout, 84x84 gray, frame skip 4,
random actions), env steps per second measured side by side, in interleaved rounds:

  (a) the vector env alone,
  (b) writing every step into an N-stream store with ``store.add_batch`` (the user's loop),
  (c) as (b) while another thread samples batches of 32 four-frame stacks as fast as it can.

It prints the ratios (b)/(a) and (c)/(a) per N (the issue's goals: >= 0.9 and >= 0.8) and the
sampler's batches/s in (c). Run: ``python tools/bench_actors.py [--seconds 4] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from replaystore import ReplayStore


def make_envs(n: int):
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv("breakout", num_envs=n, stack_num=1, img_height=84, img_width=84, noop_max=30,
                          reward_clipping=False, use_fire_reset=False)


def run(n: int, mode: str, seconds: float, root: Path) -> tuple[float, float]:
    """Env steps/s (and sampled batches/s in mode c) over ``seconds``, after a short warm-up."""
    envs = make_envs(n)
    store = None
    if mode != "a":
        path = root / f"{mode}-{n}.zarr"
        store = ReplayStore.create(path, 200_000, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4,
                                   num_streams=n, overwrite=True)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    obs = obs[:, 0]
    stop = threading.Event()
    sampled = [0]

    def sample() -> None:
        srng = np.random.default_rng(1)
        while not stop.is_set():
            store.sample(32, rng=srng)
            sampled[0] += 1

    def step(count: int) -> int:
        nonlocal obs
        done = 0
        for _ in range(count):
            actions = rng.integers(0, 4, size=n)
            nxt, r, term, trunc, _ = envs.step(actions)
            nxt = nxt[:, 0]
            if store is not None:
                store.add_batch(obs, actions, r, nxt, term, trunc)
            obs = nxt
            done += n
        return done

    step(max(1, 600 // n))  # warm-up (and enough transitions to sample from)
    sampler = threading.Thread(target=sample, daemon=True) if mode == "c" else None
    if sampler is not None:
        sampler.start()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        steps += step(max(1, 64 // n))
    elapsed = time.perf_counter() - t0
    batches = sampled[0]
    stop.set()
    if sampler is not None:
        sampler.join()
    envs.close()
    if store is not None:
        store.close()
    return steps / elapsed, batches / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--envs", default="1,2,4,8")
    args = parser.parse_args()
    ns = [int(x) for x in args.envs.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench_actors-", dir=os.environ.get("BENCH_DIR")))
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    try:
        for r in range(args.rounds):
            for n in ns:
                for mode in "abc":
                    results.setdefault((n, mode), []).append(run(n, mode, args.seconds, root))
                    print(f"round {r + 1} N={n} ({mode}): {results[(n, mode)][-1][0]:,.0f} env steps/s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"median of {args.rounds} rounds of {args.seconds:.0f} s each")
    print("| envs | (a) env alone steps/s | (b) + add_batch | (c) + a sampling thread | (b)/(a) | (c)/(a) | "
          "sampler batches/s in (c) |")
    print("|---|---|---|---|---|---|---|")
    for n in ns:
        a, b, c = (float(np.median([x[0] for x in results[(n, m)]])) for m in "abc")
        sampler = float(np.median([x[1] for x in results[(n, "c")]]))
        print(f"| {n} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {b / a:.2f} | {c / a:.2f} | {sampler:,.0f} |")


if __name__ == "__main__":
    main()
