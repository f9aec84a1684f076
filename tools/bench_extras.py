"""What extras cost (format/extras.py): the same real Breakout transitions written into stores
without extras, with two scalar extras (``is_success`` bool, ``logp`` float32, what an info and a
behaviour policy give), and with 18 float32 Q-values a move, then sampled.

Each store gets ``--steps`` moves through ``add`` (one env) in interleaved rounds, timed per move;
then ``sample(32)`` (a DQN batch of 4-frame stacks) is timed on each, in interleaved rounds, one
thread, after a warm-up; RAM is the store's per-step scalars (``memory_estimate``). Prints µs per
``add``, ms per ``sample`` and each ratio to the store without extras:

    python tools/bench_extras.py [--steps 20000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atari_frames import record  # noqa: E402
from harness import median, save  # noqa: E402

CASES = {
    "no extras": None,
    "is_success + logp": {"is_success": "bool", "logp": "float32"},
    "18 Q-values": {"q": ((18,), "float32")},
}


def extras_of(case: dict | None, i: int) -> dict | None:
    if case is None:
        return None
    out: dict = {}
    for name, spec in case.items():
        out[name] = np.full(spec[0], i % 7, np.float32) if isinstance(spec, tuple) else (
            i % 3 == 0 if spec == "bool" else -0.1 * (i % 10))
    return out


def fill(store, data: dict, case: dict | None, start: int, count: int) -> float:
    """Moves ``start .. start + count`` of ``data`` into ``store``; the seconds ``add`` took."""
    frames, index = data["frames"], data["obs_index"]
    total = 0.0
    for i in range(start, start + count):
        j = int(index[i])
        extras = extras_of(case, i)
        t0 = time.perf_counter()
        store.add(frames[j], int(data["action"][i]), float(data["reward"][i]), frames[j + 1],
                  bool(data["terminated"][i]), bool(data["truncated"][i]), extras=extras)
        total += time.perf_counter() - t0
    return total


def main() -> None:
    import gymnasium as gym

    from replaystore import ReplayStore

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    data = record(args.steps)
    obs_space, act_space = gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4)
    root = tempfile.mkdtemp(prefix="bench_extras_")
    stores = {name: ReplayStore.create(os.path.join(root, f"{i}.zarr"), args.steps + 1000, obs_space, act_space, 4,
                                       extras=case)
              for i, (name, case) in enumerate(CASES.items())}
    add_s = dict.fromkeys(CASES, 0.0)
    chunk = -(-args.steps // (4 * args.rounds))
    for first in range(0, args.steps, chunk):  # interleaved: every store gets each slice in turn
        count = min(chunk, args.steps - first)
        for name, case in CASES.items():
            add_s[name] += fill(stores[name], data, case, first, count)
    for store in stores.values():
        store.flush()
        store.sample(32, rng=np.random.default_rng(0))  # warm-up
    sample_s: dict[str, list[float]] = {name: [] for name in CASES}
    for r in range(args.rounds):
        for name, store in stores.items():
            rng = np.random.default_rng(r)
            t0 = time.perf_counter()
            for _ in range(300):
                store.sample(32, rng=rng)
            sample_s[name].append((time.perf_counter() - t0) / 300)
    rows = []
    base_add, base_sample = add_s["no extras"] / args.steps, (median(sample_s["no extras"]))
    print(f"{args.steps:,} Breakout moves, 4-frame stacks; medians of {args.rounds} rounds")
    print(f"{'store':<20} {'us/add':>8} {'x':>6} {'ms/sample(32)':>14} {'x':>6} {'scalar RAM':>12}")
    for name, store in stores.items():
        per_add = add_s[name] / args.steps
        per_sample = (median(sample_s[name]))
        ram = store.memory_estimate()["scalars"]
        rows.append({"store": name, "us_per_add": per_add * 1e6, "add_ratio": per_add / base_add,
                     "ms_per_sample": per_sample * 1e3, "sample_ratio": per_sample / base_sample,
                     "scalar_bytes": ram, "scalar_bytes_per_step": ram / store.capacity})
        print(f"{name:<20} {per_add * 1e6:>8.1f} {per_add / base_add:>6.2f} {per_sample * 1e3:>14.3f} "
              f"{per_sample / base_sample:>6.2f} {ram / store.capacity:>9.0f} B/step")
        store.close()
    save(Path(args.json) if args.json else None, {"steps": args.steps, "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
    main()
