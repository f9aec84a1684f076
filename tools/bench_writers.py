"""The write path with many streams: what a vector env's store costs in RAM and in stalls.

A store of 1M Atari steps (84x84 uint8, frame_stack 4, the default layout) is created with ``S``
streams, and a vector env of ``S`` envs is played back into it with ``add_batch``: real Breakout
frames (atari_frames.py), ``--steps`` moves a stream, so every stream crosses two shards. Each
stream count runs in its own process, so its RSS is its own. Reported per count: RSS added by the
store (after creating it, and after the moves), agent steps/s through ``add_batch``, the slowest
single ``add_batch`` (the step on which every stream writes a whole shard) and ``flush``.

    python tools/bench_writers.py [--streams 1 8 32] [--steps 9000] [--capacity 1000000] [--json tools/out/bench_writers.json]

With a small ``--capacity`` (such as 8192 steps a stream) the rings come round, and every shard the
writers fill was stored before: the steady state of a long run, where each chunk is decoded before
it is written over.

Compare two versions with tools/ab.py (``--old REV --json ... -- python tools/bench_writers.py``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import child, memory, save  # noqa: E402

HERE = Path(__file__).resolve().parent


def one(streams: int, steps: int, capacity: int) -> dict[str, float]:
    """Create and fill a store of ``streams`` streams in this process; its figures."""
    import gymnasium as gym
    import numpy as np

    sys.path.insert(0, str(HERE))
    from atari_frames import record

    from replaystore import ReplayStore

    frames = record(100_000)["frames"]
    n = len(frames)
    where = Path(tempfile.mkdtemp(prefix="bench_writers_"))
    try:
        before = memory()["VmRSS"]
        store = ReplayStore.create(where / "s.zarr", capacity, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                                   gym.spaces.Discrete(4), 4, num_streams=streams)
        created = memory()["VmRSS"]
        offsets = np.arange(streams) * 997
        obs = frames[offsets % n]
        actions, rewards = np.zeros(streams, np.int64), np.zeros(streams, np.float32)
        flags = np.zeros(streams, bool)
        worst = 0.0
        t0 = time.perf_counter()
        for t in range(steps):
            nxt = frames[(offsets + t + 1) % n]
            a = time.perf_counter()
            store.add_batch(obs, actions, rewards, nxt, flags, flags)
            worst = max(worst, time.perf_counter() - a)
            obs = nxt
        elapsed = time.perf_counter() - t0
        filled = memory()["VmRSS"]
        a = time.perf_counter()
        store.flush()
        flush = time.perf_counter() - a
        store.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return {"rss_created_mb": created - before, "rss_filled_mb": filled - before,
            "agent_steps_per_s": streams * steps / elapsed, "worst_add_ms": worst * 1e3, "flush_ms": flush * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=9000)
    ap.add_argument("--capacity", type=int, default=1_000_000, help="the store's, split over the streams")
    ap.add_argument("--json", type=Path, default=HERE / "out" / "bench_writers.json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a child: one stream count, JSON on stdout)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.capacity)))
        return 0
    results = {}
    print(f"{'streams':>7}  {'RSS created':>11}  {'RSS filled':>10}  {'agent steps/s':>13}  {'worst add':>9}  {'flush':>7}")
    for s in args.streams:
        r = results[str(s)] = child([__file__, "--one", str(s), "--steps", str(args.steps), "--capacity",
                                     str(args.capacity)])
        print(f"{s:>7}  {r['rss_created_mb']:>8.0f} MB  {r['rss_filled_mb']:>7.0f} MB  {r['agent_steps_per_s']:>13,.0f}  "
              f"{r['worst_add_ms']:>6.0f} ms  {r['flush_ms']:>4.0f} ms", flush=True)
    save(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
