"""RAM by store length: what a process that opens an Atari store and samples it holds, in all.

Builds Breakout stores of each ``--steps`` length (real frames from tools/atari_frames.py's
recording, tiled, written with ``load_steps``; kept under tools/out/ for the next run), then, for
each, a child process that imports replaystore, opens the store read-only and draws ``--batches``
uniform batches of 32 four-frame stacks, then as many prioritized ones (``alpha`` 0.6, with
priority updates, which widen the priorities to float32). The child reports its peak RSS (VmHWM)
after each phase. With ``--before DIR`` (a checkout of an older commit: ``git worktree add DIR
REV``), the same child runs on DIR's replaystore too, in the same run.

Prints a table (MB), the bytes per step (the slope between the two longest stores) and what they
come to at 250M steps (the DQN Replay Dataset's five runs of a game), and writes
tools/out/bench_ram.json.

    python tools/bench_ram.py [--steps 1000000 4000000 16000000] [--before DIR] [--cache-mb 256] [--copies 4]

``--copies K`` adds the longest store as K streams, each the whole of it (``assemble``: its shard
files hard-linked into a store of K streams, which ``replaystore verify`` passes): 4 x 64M steps is
the DQN Replay Dataset's five runs of a game (250M), built in seconds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record  # noqa: E402
from harness import child, save  # noqa: E402

FULL_SCALE = 250_000_000

CHILD = r"""
import sys, time
import numpy as np
from harness import memory, report
phases = {}
def mark(name):
    phases[name] = memory()["VmHWM"]
import replaystore
from replaystore import ReplayStore
mark("import")
path, batches, cache = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
store = ReplayStore.open(path, cache_bytes=cache)
opened = time.perf_counter() - t
mark("open")
rng = np.random.default_rng(0)
t = time.perf_counter()
for _ in range(batches):
    store.sample(32, rng=rng)
uniform = batches / (time.perf_counter() - t)
mark("uniform")
t = time.perf_counter()
for _ in range(batches):
    b = store.sample(32, rng=rng, prioritized=True, alpha=0.6)
    store.update_priorities(b.index, rng.uniform(0.01, 2.0, 32))
prioritized = batches / (time.perf_counter() - t)
mark("prioritized")
report({"phases": phases, "len": len(store), "streams": store.num_streams, "open_s": opened, "uniform_per_s": uniform,
        "prioritized_per_s": prioritized, "module": replaystore.__file__})
"""


def steps_of_recording(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The recording as steps (frame ``t`` is step ``t``): each step's move, ``ep_step`` and ``is_last``."""
    n = len(data["frames"])
    out = {"action": np.zeros(n, np.int32), "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool),
           "truncated": np.zeros(n, bool), "is_last": np.zeros(n, bool), "priority": np.zeros(n, np.float32),
           "ep_step": np.zeros(n, np.int32)}
    j = data["obs_index"]
    out["action"][j] = data["action"]
    out["reward"][j] = data["reward"]
    out["terminated"][j] = data["terminated"]
    out["truncated"][j] = data["truncated"]
    out["truncated"][j[-1]] |= not data["terminated"][-1]  # the recording's last episode ends there
    out["priority"][j] = 1.0
    out["is_last"][j + 1] = out["terminated"][j] | out["truncated"][j]
    moved = np.zeros(n, bool)
    moved[j] = True
    ep = 0
    for t in range(n):  # once, over the recording (~100k steps)
        out["ep_step"][t] = ep
        ep = 0 if out["is_last"][t] else ep + 1
    keep = int(np.flatnonzero(out["is_last"])[-1]) + 1  # whole episodes only, so tiles join
    return {k: v[:keep] for k, v in out.items()}


def build(path: Path, steps: int, data: dict[str, np.ndarray]) -> None:
    from replaystore import ReplayStore

    tile = steps_of_recording(data)
    n_tile = len(tile["ep_step"])
    frames = data["frames"][:n_tile]
    reps = -(-steps // n_tile)
    scalars = {k: np.tile(v, reps)[:steps] for k, v in tile.items()}
    last = np.flatnonzero(scalars["is_last"])[-1] + 1  # end on a whole episode
    scalars = {k: v[:last] for k, v in scalars.items()}
    n = int(last)
    shutil.rmtree(path, ignore_errors=True)
    store = ReplayStore.create(path, observation_space=_space(frames), action_space=_actions(), capacity=n,
                               frame_stack=4, cache_bytes=0)

    def blocks():
        for at in range(0, n, n_tile):
            yield frames[: min(n_tile, n - at)]

    store.load_steps(scalars, blocks())
    store.flush()
    store.close()


def assemble(src: Path, dst: Path, copies: int) -> None:
    """A store of ``copies`` streams, each holding the one stream of ``src``: the format's version 2
    made by ``ReplayStore.create``, every shard file of ``src`` hard-linked (not copied) to its place
    in each stream (docs/format.md, "Streams"), each stream's commit ``src``'s. Real frames, and
    ``copies`` times the steps, in seconds and no more disk."""
    import os

    from replaystore import ReplayStore
    from replaystore.format.schema import array_names, item_ndim
    from replaystore.format.shards import shard_key
    from replaystore.storage.choose import open_backend

    with ReplayStore.open(src) as one:
        schema, layout, state = one.schema, one.layout, one.stream_states()[0]
        spaces = (one.observation_space, one.action_space)
    shutil.rmtree(dst, ignore_errors=True)
    ReplayStore.create(dst, copies * schema.capacity, *spaces, schema.frame_stack, layout=layout, num_streams=copies,
                       cache_bytes=0).close()
    source, target = open_backend(src), open_backend(dst)
    source.read_metadata()
    target.read_metadata()
    shards = -(-schema.capacity // layout.shard_len)
    for k in range(copies):
        for name in array_names(schema):
            ndim = item_ndim(schema, name)
            for j in range(shards):
                there = src / shard_key(name, source.shard_of(0, j), ndim)
                if there.exists():
                    here = dst / shard_key(name, target.shard_of(k, j), ndim)
                    here.parent.mkdir(parents=True, exist_ok=True)
                    os.link(there, here)
        target.claim(k)
        target.commit(k, state)
        target.release(k)


def _space(frames: np.ndarray):
    import gymnasium as gym

    return gym.spaces.Box(0, 255, frames.shape[1:], np.uint8)


def _actions():
    import gymnasium as gym

    return gym.spaces.Discrete(4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--cache-mb", type=int, default=256)
    ap.add_argument("--before", type=Path, help="a checkout of an older commit to measure beside this one")
    ap.add_argument("--copies", type=int, default=0,
                    help="also the longest store as this many streams (assemble), measured with this checkout only")
    args = ap.parse_args()
    data = record(100_000)
    codes = {"now": Path(__file__).resolve().parents[1]}
    if args.before is not None:
        codes = {"before": args.before.resolve(), **codes}
    stores = []
    for steps in args.steps:
        path = OUT / f"bench_ram_{steps}.zarr"
        if not (path / "zarr.json").exists():
            print(f"building {path} ...", flush=True)
            build(path, steps, data)
        stores.append((steps, path, codes))
    if args.copies > 1:
        steps = max(args.steps)
        path = OUT / f"bench_ram_{steps}x{args.copies}.zarr"
        if not (path / "zarr.json").exists():
            assemble(OUT / f"bench_ram_{steps}.zarr", path, args.copies)
        stores.append((steps * args.copies, path, {"now": codes["now"]}))
    rows = []
    for steps, path, versions in stores:
        for name, code in versions.items():
            got = child([str(path), str(args.batches), str(args.cache_mb << 20)], code=CHILD,
                        env={"PYTHONPATH": str(code)})
            assert got["module"].startswith(str(code)), got["module"]
            rows.append({"code": name, "steps": got["len"], **got})
            p = got["phases"]
            print(f"{name:6s} {steps:>12,d} steps ({got['streams']} stream{'s' if got['streams'] > 1 else ''})  import {p['import']:7.0f}  open {p['open']:7.0f}  "
                  f"uniform {p['uniform']:7.0f}  prioritized {p['prioritized']:7.0f} MB  "
                  f"(open {got['open_s']:.1f} s, {got['uniform_per_s']:.0f} / {got['prioritized_per_s']:.0f} batches/s)",
                  flush=True)
    print()
    slopes = {}
    for name in codes:
        mine = sorted((r for r in rows if r["code"] == name and r["streams"] == 1), key=lambda r: r["steps"])
        if len(mine) < 2:
            continue
        a, b = mine[-2], mine[-1]
        slopes[name] = {}
        for phase in ("open", "uniform", "prioritized"):
            per_step = (b["phases"][phase] - a["phases"][phase]) * 2**20 / (b["steps"] - a["steps"])
            at_full = b["phases"][phase] + per_step * (FULL_SCALE - b["steps"]) / 2**20
            slopes[name][phase] = {"bytes_per_step": per_step, "mb_at_250m": at_full}
            print(f"{name:6s} {phase:12s} {per_step:6.2f} bytes a step -> {at_full / 1024:6.2f} GB at 250M steps")
    save(OUT / "bench_ram.json", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "slopes": slopes})


if __name__ == "__main__":
    main()
