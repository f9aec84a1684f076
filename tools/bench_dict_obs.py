"""Dict observations for SB3's ``MultiInputPolicy``: SB3's ``DictReplayBuffer`` against
``ReplayStoreBuffer`` on the same Dict space, and against ``ReplayStoreBuffer`` on the flattened Box
(what a user had to do before: gymnasium's ``FlattenObservation``).

The transitions have FetchReach's shapes (``observation`` float64 (10,), ``achieved_goal`` and
``desired_goal`` float64 (3,), 50-move episodes) from a random walk, no simulator: one env, added as
SB3's SAC adds them, then ``sample(256)`` (SAC's batch, torch tensors) is timed on each buffer in
interleaved rounds, one thread, after a warm-up. It prints ms per sample, its ratio to SB3's, us
per ``add``, and what each buffer holds (SB3: its arrays in RAM; the stores: bytes on disk):

    python tools/bench_dict_obs.py [--steps 100000 1000000] [--rounds 3] [--json out.json]
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
import harness  # noqa: E402
from harness import median, order  # noqa: E402

BATCH = 256
EPISODE = 50


def spaces() -> tuple[object, object]:
    import gymnasium as gym

    box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
    return (gym.spaces.Dict({"observation": box(10), "achieved_goal": box(3), "desired_goal": box(3)}),
            gym.spaces.Box(-1, 1, (4,), np.float32))


def record(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``steps`` moves of a random walk toward a goal, episodes of ``EPISODE`` moves: every
    observation (obs, next_obs) as arrays ``(steps, n)``, and the actions, rewards and dones."""
    rng = np.random.default_rng(seed)
    action = rng.uniform(-1, 1, (steps, 4)).astype(np.float32)
    episodes = -(-steps // EPISODE)
    walk = (rng.normal(size=(episodes, 1, 10)) + np.cumsum(0.05 * rng.normal(size=(episodes, EPISODE + 1, 10)), 1))
    goal = np.repeat(rng.normal(size=(episodes, 1, 3)), EPISODE + 1, 1)
    obs = {"observation": walk[:, :-1].reshape(-1, 10)[:steps], "achieved_goal": walk[:, :-1, :3].reshape(-1, 3)[:steps],
           "desired_goal": goal[:, :-1].reshape(-1, 3)[:steps]}
    nxt = {"observation": walk[:, 1:].reshape(-1, 10)[:steps], "achieved_goal": walk[:, 1:, :3].reshape(-1, 3)[:steps],
           "desired_goal": goal[:, 1:].reshape(-1, 3)[:steps]}
    done = np.arange(steps) % EPISODE == EPISODE - 1
    reward = -np.linalg.norm(nxt["achieved_goal"] - nxt["desired_goal"], axis=1).astype(np.float32)
    return {"obs": obs, "next_obs": nxt, "action": action, "done": done, "reward": reward}


def flat(obs: dict[str, np.ndarray]) -> np.ndarray:
    """As ``FlattenObservation`` gives the Dict: the keys in the space's (sorted) order."""
    return np.concatenate([obs[k] for k in sorted(obs)], axis=-1)


def fill(buffer: object, data: dict, flatten: bool) -> float:
    """Add every transition as SB3 does with one env; returns the seconds it took."""
    start = time.perf_counter()
    obs, nxt = data["obs"], data["next_obs"]
    for i in range(len(data["done"])):
        o = {k: v[i : i + 1] for k, v in obs.items()}
        n = {k: v[i : i + 1] for k, v in nxt.items()}
        if flatten:
            o, n = flat(o), flat(n)
        buffer.add(o, n, data["action"][i : i + 1], data["reward"][i : i + 1], data["done"][i : i + 1], [{}])  # type: ignore[attr-defined]
    return time.perf_counter() - start


def rate(buffer: object, calls: int) -> float:
    """Milliseconds per ``sample(BATCH)``."""
    start = time.perf_counter()
    for _ in range(calls):
        buffer.sample(BATCH)  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / calls * 1e3


def holds(buffer: object) -> str:
    store = getattr(buffer, "store", None)
    if store is not None:
        store.flush()
        return f"{sum(store.backend.stored_bytes().values()) / 1e6:,.1f} MB on disk"
    arrays = [v for v in vars(buffer).values() if isinstance(v, np.ndarray)]
    arrays += [a for v in vars(buffer).values() if isinstance(v, dict) for a in v.values() if isinstance(a, np.ndarray)]
    return f"{sum(a.nbytes for a in arrays) / 1e6:,.1f} MB in RAM"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=500, help="sample calls timed per contender and round")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import gymnasium as gym

    from replaystore.integrations.sb3 import buffer_class

    ReplayStoreBuffer = buffer_class()  # before SB3's own import: triton before tensorflow (sb3.py)
    from stable_baselines3.common.buffers import DictReplayBuffer

    space, actions = spaces()
    flat_space = gym.spaces.flatten_space(space)
    results: dict[str, dict] = {}
    for steps in args.steps:
        data = record(steps)
        with tempfile.TemporaryDirectory() as tmp:
            kw = {"handle_timeout_termination": False}
            buffers = {
                "SB3 DictReplayBuffer": (DictReplayBuffer(steps, space, actions, "cpu", **kw), False),
                "ReplayStoreBuffer, Dict": (ReplayStoreBuffer(steps, space, actions, "cpu", **kw,
                                                              path=os.path.join(tmp, "dict.zarr")), False),
                "ReplayStoreBuffer, flattened Box": (ReplayStoreBuffer(steps, flat_space, actions, "cpu", **kw,
                                                                       path=os.path.join(tmp, "flat.zarr")), True),
            }
            adds = {name: fill(buffer, data, flatten) for name, (buffer, flatten) in buffers.items()}
            for buffer, _ in buffers.values():
                rate(buffer, 100)  # warm: the caches filled
            times: dict[str, list[float]] = {name: [] for name in buffers}
            for r in range(args.rounds):
                for name in order(list(buffers), r):
                    times[name].append(rate(buffers[name][0], args.calls))
            base = (median(times["SB3 DictReplayBuffer"]))
            print(f"\n{steps:,} transitions of FetchReach's shapes, sample({BATCH}), {args.rounds} rounds (median)",
                  flush=True)
            print(f"{'buffer':34s} {'ms per sample':>14s} {'x SB3':>7s} {'add us':>8s}  holds")
            for name, ts in times.items():
                med = (median(ts))
                held = holds(buffers[name][0])
                print(f"{name:34s} {med:14.3f} {med / base:7.2f} {adds[name] / steps * 1e6:8.1f}  {held}")
                results[f"{steps} {name}"] = {"ms_per_sample": ts, "median_ms": med, "x_sb3": med / base,
                                              "us_per_add": adds[name] / steps * 1e6, "holds": held}
            for buffer, _ in buffers.values():
                if hasattr(buffer, "close"):
                    buffer.close()
    save(args.json, results)


def save(path: str | None, results: dict) -> None:
    """The results as JSON at ``path`` (None: nowhere), with the batch size, Python and the time."""
    harness.save(Path(path) if path else None, {"batch": BATCH, "results": results})


if __name__ == "__main__":
    main()
