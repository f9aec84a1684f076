"""Choose the on-disk layout by measurement: codec, level, chunk and shard length on real ALE frames.

For each candidate it writes the same recorded Breakout transitions through ``ReplayStore.add``
(write transitions/s, one process), reports bytes on disk and the compression ratio of the frames,
then samples batches of 32 four-frame stacks from the reopened store (batches/s, one thread).
Run: python tools/bench_layout.py [--transitions 20000]. Writes tools/out/bench_layout.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record, replay_into  # noqa: E402
from harness import save  # noqa: E402

from replaystore import CodecSpec, Layout, ReplayStore  # noqa: E402

CANDIDATES = [
    ("zstd-1", CodecSpec("zstd", 1), 8, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 8, 4096),
    ("zstd-9", CodecSpec("zstd", 9), 8, 4096),
    ("blosc-lz4-5", CodecSpec("blosc", 5, "lz4"), 8, 4096),
    ("blosc-zstd-3", CodecSpec("blosc", 3, "zstd"), 8, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 1, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 4, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 16, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 32, 4096),
    ("zstd-3", CodecSpec("zstd", 3), 8, 1024),
]


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(data: dict, transitions: int, codec: CodecSpec, chunk_len: int, shard_len: int) -> dict:
    import gymnasium as gym

    path = OUT / "bench_layout.zarr"
    shutil.rmtree(path, ignore_errors=True)
    store = ReplayStore.create(path, transitions + transitions // 50 + 16, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                               gym.spaces.Discrete(4), 4, layout=Layout(shard_len, chunk_len, codec))
    t0 = time.perf_counter()
    replay_into(store, data, transitions)
    store.close()
    write_s = time.perf_counter() - t0
    obs_bytes = du(path / "obs")
    reader = ReplayStore.open(path)
    rng = np.random.default_rng(0)
    reader.sample(32, rng=rng)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        reader.sample(32, rng=rng)
        n += 1
    sample_s = time.perf_counter() - t0
    frames = reader.added
    return {
        "write_transitions_per_s": transitions / write_s,
        "ratio": frames * 84 * 84 / obs_bytes,
        "mb_per_1m_frames": obs_bytes / frames * 1e6 / 1e6,
        "store_bytes": du(path),
        "batches_per_s": n / sample_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=20000)
    args = ap.parse_args()
    data = record(args.transitions)
    print(f"{args.transitions} transitions of real Breakout frames (random policy), 84x84 uint8, stack 4, batch 32")
    print(f"{'codec':14s} {'chunk':>5s} {'shard':>5s} {'ratio':>6s} {'MB/1M frames':>12s} {'write tr/s':>10s} {'batches/s':>9s}")
    results = []
    for name, codec, chunk_len, shard_len in CANDIDATES:
        r = measure(data, args.transitions, codec, chunk_len, shard_len)
        results.append({"codec": name, "chunk_len": chunk_len, "shard_len": shard_len, **r})
        print(f"{name:14s} {chunk_len:5d} {shard_len:5d} {r['ratio']:6.1f} {r['mb_per_1m_frames']:12.1f} "
              f"{r['write_transitions_per_s']:10.0f} {r['batches_per_s']:9.0f}")
    save(OUT / "bench_layout.json", results)
    shutil.rmtree(OUT / "bench_layout.zarr", ignore_errors=True)


if __name__ == "__main__":
    main()
