"""A Minari dataset of Atari frame stacks into a store and back out: what it costs, and what it buys.

A Minari dataset like one recorded behind ``FrameStackObservation(AtariPreprocessing(...), 4)`` is
made from real Breakout frames (tools/atari_frames.py, a random policy): each observation a
``(4, 84, 84)`` stack, in Minari's HDF5 (uncompressed). Then, each in its own process (peak RSS):

- **import**: ``store_from_minari`` (stacks found, each frame stored once, compressed);
- **sampling**, in interleaved rounds on one thread: ``store.sample(32)`` on the new store, against
  reading 32 uniformly drawn transitions straight from the dataset's HDF5 with h5py (``obs[t]``,
  ``obs[t + 1]`` and the move's fields, per transition): what a user without the store can do
  without loading the dataset into RAM (the figure for that, the dataset's bytes, is printed);
- **export**: ``minari_from_store`` of the store's frames, and of its stacks (``stacks=True``).

    python tools/bench_minari.py [--steps 100000] [--rounds 3] [--json out.json]

Needs tools/out/ space for the dataset (28 KB a step) and ``pip install 'replaystore[minari]'``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record  # noqa: E402
from harness import child as run_child  # noqa: E402
from harness import median, save  # noqa: E402

BATCH = 32
DATASET = "bench/breakout-stacks-v0"


def episodes(data: dict[str, np.ndarray]):
    """The recording's episodes as Minari EpisodeBuffers of 4-frame stacks (reset-padded)."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    frames, idx = data["frames"], data["obs_index"]
    ends = np.flatnonzero(data["terminated"] | data["truncated"])
    start = 0
    for end in [*ends.tolist(), idx.size - 1]:
        if end < start:
            continue
        rows = np.arange(start, end + 1)
        seq = np.append(idx[rows], idx[end] + 1)  # the frames of its observations, then the last one
        back = np.arange(seq.size)[:, None] - np.arange(3, -1, -1)[None, :]
        obs = frames[seq[np.maximum(back, 0)]]
        truncated = data["truncated"][rows].copy()
        truncated[-1] |= not data["terminated"][end]
        yield EpisodeBuffer(observations=obs, actions=data["action"][rows], rewards=data["reward"][rows],
                            terminations=data["terminated"][rows], truncations=truncated, infos={})
        start = end + 1


def make_dataset(steps: int) -> None:
    import gymnasium as gym
    import minari

    if (Path(os.environ["MINARI_DATASETS_PATH"]) / DATASET).exists():
        return
    data = record(steps)
    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(DATASET, episodes(data), observation_space=obs_space,
                                           action_space=gym.spaces.Discrete(4), jpeg_encoding=False)


CHILD = r"""
import sys, time
from harness import report
from replaystore.integrations.minari import store_from_minari, minari_from_store
what, a, b = sys.argv[1:4]
t = time.perf_counter()
if what == "import":
    r = store_from_minari(a, b)
    out = {"moves": r.moves, "episodes": r.episodes, "bytes": r.bytes_on_disk, "stacking": r.stacking}
else:
    r = minari_from_store(a, b, stacks=what == "export-stacks")
    out = {"moves": r.moves, "episodes": r.episodes}
out["seconds"] = time.perf_counter() - t
report(out)  # (with its peak RSS: VmHWM)
"""


def child(*args: str) -> dict:
    return run_child(args, code=CHILD)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def h5_rate(data_path: Path, seconds: float, rng: np.random.Generator) -> float:
    """Batches of 32 uniformly drawn transitions per second, read row by row from Minari's HDF5."""
    import h5py

    with h5py.File(data_path / "main_data.hdf5", "r") as f:
        groups = [f[name] for name in f]
        lengths = np.array([g.attrs["total_steps"] for g in groups])
        cum = np.concatenate([[0], np.cumsum(lengths)])
        obs = np.empty((BATCH, 4, 84, 84), np.uint8)
        nxt = np.empty_like(obs)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            draws = rng.integers(cum[-1], size=BATCH)
            e = np.searchsorted(cum, draws, side="right") - 1
            for j, (ep, t) in enumerate(zip(e, draws - cum[e])):
                g = groups[ep]
                pair = g["observations"][t:t + 2]
                obs[j], nxt[j] = pair[0], pair[1]
                _ = (g["actions"][t], g["rewards"][t], g["terminations"][t], g["truncations"][t])
            n += 1
        return n / (time.perf_counter() - t0)


def store_rate(path: Path, seconds: float, rng: np.random.Generator) -> float:
    from replaystore import ReplayStore

    with ReplayStore.open(path) as store:
        store.sample(BATCH, rng=rng)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            store.sample(BATCH, rng=rng)
            n += 1
        return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="per sampling round and contender")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = OUT / f"minari_{args.steps}"
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    t = time.perf_counter()
    make_dataset(args.steps)
    print(f"dataset {DATASET}: {du(root / DATASET) / 1e6:,.0f} MB of HDF5 ({time.perf_counter() - t:.0f} s to make)")
    store = root / "store.zarr"
    for p in (store, root / "back"):
        shutil.rmtree(p, ignore_errors=True)
    result: dict = {"steps": args.steps, "dataset_bytes": du(root / DATASET)}
    result["import"] = child("import", DATASET, str(store))
    imp = result["import"]
    print(f"import: {imp['moves']:,} moves in {imp['episodes']:,} episodes, {imp['seconds']:.1f} s "
          f"({imp['moves'] / imp['seconds']:,.0f} moves/s), peak RSS {imp['peak_rss_mb']:,.0f} MB; "
          f"{imp['bytes'] / 1e6:,.1f} MB on disk ({result['dataset_bytes'] / imp['bytes']:,.0f}x smaller); "
          f"{imp['stacking']}")
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {"store": [], "hdf5": []}
    for r in range(args.rounds):
        order = ["store", "hdf5"] if r % 2 == 0 else ["hdf5", "store"]
        for name in order:
            rate = (store_rate(store, args.seconds, rng) if name == "store"
                    else h5_rate(root / DATASET / "data", args.seconds, rng))
            rates[name].append(rate)
    result["sampling"] = rates
    s, h = median(rates["store"]), median(rates["hdf5"])
    print(f"sampling {BATCH} transitions, one thread, {args.rounds} rounds: store {s:,.0f} batches/s "
          f"({', '.join(f'{x:,.0f}' for x in rates['store'])}), HDF5 row reads {h:,.0f} "
          f"({', '.join(f'{x:,.0f}' for x in rates['hdf5'])}): {s / h:.1f}x; the dataset in RAM as arrays: "
          f"{result['dataset_bytes'] / 1e6:,.0f} MB")
    for what, name in (("export-frames", "back/frames-v0"), ("export-stacks", "back/stacks-v0")):
        result[what] = child(what, str(store), name)
        x = result[what]
        x["bytes"] = du(root / name)
        print(f"{what}: {x['moves']:,} moves, {x['seconds']:.1f} s ({x['moves'] / x['seconds']:,.0f} moves/s), "
              f"peak RSS {x['peak_rss_mb']:,.0f} MB, {x['bytes'] / 1e6:,.0f} MB of HDF5")
    shutil.rmtree(root / "back", ignore_errors=True)
    if args.json:
        save(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
