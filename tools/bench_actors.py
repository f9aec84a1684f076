"""Acting with N environments into one store: what writing costs the actors.

For N = 1, 2, 4, 8 envs of ale-py's C++ ``AtariVectorEnv`` (Breakout, 84x84 gray, frame skip 4,
random actions), env steps per second measured side by side, in interleaved rounds:

  (a) the vector env alone,
  (b) writing every step into an N-stream store with ``store.add_batch`` (the user's loop),
  (c) as (b) while another thread samples batches of 32 four-frame stacks as fast as it can,
  (p) as (c) with the sampler in another process (a read-only handle that calls ``refresh()``
      every 50 batches): no GIL shared with the actor, only the cores,
  (r) as (c) with the sampling thread held to DQN's replay ratio of 8 (one batch of 32 per 4
      transitions added), as a learner samples; it sleeps when it is ahead.

It prints the ratios (b)/(a), (c)/(a), (p)/(a) and (r)/(a) per N (the issue's goals: >= 0.9 and >= 0.8)
and the samplers' batches/s. Run: ``python tools/bench_actors.py [--seconds 4] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from replaystore import ReplayStore

sys.path.insert(0, str(Path(__file__).parent))
from harness import median  # noqa: E402


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

    added = [0]

    def sample() -> None:
        srng = np.random.default_rng(1)
        while not stop.is_set():
            if mode == "r" and sampled[0] * 4 >= added[0]:
                time.sleep(0.0005)
                continue
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
            added[0] += n
        return done

    step(max(1, 600 // n))  # warm-up (and enough transitions to sample from)
    added[0] = sampled[0] = 0
    sampler = threading.Thread(target=sample, daemon=True) if mode in "cr" else None
    if sampler is not None:
        sampler.start()
    child = None
    if mode == "p":
        store.flush()
        ctx = mp.get_context("spawn")
        counter, ready, go = ctx.Value("q", 0), ctx.Event(), ctx.Event()
        child = ctx.Process(target=sample_process, args=(str(path), counter, ready, go, stop_flag := ctx.Event()))
        child.start()
        ready.wait(120)
        go.set()
    t0, steps = time.perf_counter(), 0
    start_count = counter.value if child is not None else 0
    while time.perf_counter() - t0 < seconds:
        steps += step(max(1, 64 // n))
    elapsed = time.perf_counter() - t0
    batches = sampled[0] if child is None else counter.value - start_count
    stop.set()
    if sampler is not None:
        sampler.join()
    if child is not None:
        stop_flag.set()
        child.join(30)
    envs.close()
    if store is not None:
        store.close()
    return steps / elapsed, batches / elapsed


def sample_process(path: str, counter, ready, go, stop) -> None:
    """Mode (p): sample batches of 32 from a read-only handle as fast as possible, following the writer."""
    store = ReplayStore.open(path)
    rng = np.random.default_rng(1)
    ready.set()
    go.wait()
    count = 0
    while not stop.is_set():
        store.sample(32, rng=rng)
        count += 1
        if count % 50 == 0:
            store.refresh()
            counter.value = count
    store.close()


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
                for mode in "abcpr":
                    results.setdefault((n, mode), []).append(run(n, mode, args.seconds, root))
                    print(f"round {r + 1} N={n} ({mode}): {results[(n, mode)][-1][0]:,.0f} env steps/s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"median of {args.rounds} rounds of {args.seconds:.0f} s each")
    print("| envs | (a) env alone steps/s | (b) + add_batch | (c) + sampling thread | (p) + sampling process | "
          "(r) + sampling at ratio 8 | (b)/(a) | (c)/(a) | (p)/(a) | (r)/(a) | batches/s in (c) / (p) / (r) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        a, b, c, q, r8 = ((median([x[0] for x in results[(n, m)]])) for m in "abcpr")
        bc, bp, br = ((median([x[1] for x in results[(n, m)]])) for m in "cpr")
        print(f"| {n} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {q:,.0f} | {r8:,.0f} | {b / a:.2f} | {c / a:.2f} | {q / a:.2f} | "
              f"{r8 / a:.2f} | {bc:,.0f} / {bp:,.0f} / {br:,.0f} |")


if __name__ == "__main__":
    main()
