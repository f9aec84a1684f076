"""``replaystore import-dopamine`` on real Atari frames: rows a second and peak RSS.

A Dopamine run is written from real Breakout frames (tools/atari_frames.py, a random policy; every
episode end marked terminal, as Dopamine marks it) by the Dopamine-format writer the tests use
(tests/dopamine_format.py): ``--saves`` checkpoints of a ``--capacity``-row ring, one every
``--every`` env steps, as the DQN Replay Dataset's runs are (there: 1M rows, a save every 1M env
steps, ~50 saves; the zero rows Dopamine adds before each episode make each save's adds a little
more than its steps, so the ring has overwritten those few rows by the next save: a gap). Then, in a child process, ``store_from_dopamine`` imports it; the child reports its wall
time and peak RSS (VmHWM), beside the bytes one checkpoint's observations take in RAM (what
Dopamine's ``FixedReplayBuffer`` holds for each checkpoint it loads).

    python tools/bench_dopamine.py [--capacity 100000] [--every 100000] [--saves 4] [--json out.json]

Needs tools/out/ space for the run (about 1/3 of the raw frames with gzip level 1) and the store.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from atari_frames import OUT, record  # noqa: E402
from dopamine_format import DopamineBuffer  # noqa: E402
from harness import child, save  # noqa: E402

CHILD = r"""
import sys, time
from harness import report
from replaystore.integrations.dopamine import store_from_dopamine
t0 = time.perf_counter()
r = store_from_dopamine([sys.argv[1]], sys.argv[2])
wall = time.perf_counter() - t0
run = r.runs[0]
report({"wall_s": wall, "rows": run.rows, "steps": run.steps, "shared": run.shared, "gaps": run.gaps,
        "rows_lost": run.rows_lost, "checkpoints": run.checkpoints, "store_bytes": r.bytes_on_disk})
"""


def write_run(folder: Path, capacity: int, every: int, saves: int) -> None:
    """The run's checkpoints from real frames, seed after seed of tools/atari_frames.py (seeds 0-4,
    then again: a run of more than 500k steps repeats its frames)."""
    buffer = DopamineBuffer(capacity, 4, 1, (84, 84))
    seed, t, data = 0, 0, record(100_000, seed=0)
    for number in range(saves):
        for _ in range(every):  # env steps, as Dopamine's iterations count them (its pad rows come on top)
            if t == data["action"].size:
                seed, t = seed + 1, 0
                data = record(100_000, seed=seed % 5)  # (the 5 recordings the other benchmarks use, again)
            end = bool(data["terminated"][t] or data["truncated"][t])
            buffer.add(data["frames"][data["obs_index"][t]], int(data["action"][t]), float(data["reward"][t]), end)
            t += 1
        buffer.save(folder, number, level=1)
        print(f"saved checkpoint {number} (add_count {int(buffer.add_count):,})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=100_000, help="env steps between saves")
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    folder = OUT / f"dopamine_breakout_{args.capacity}_{args.every}_{args.saves}" / "replay_logs"
    if not (folder / f"add_count_ckpt.{args.saves - 1}.gz").exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_run(folder, args.capacity, args.every, args.saves)
    store = OUT / "dopamine_breakout.zarr"
    shutil.rmtree(store, ignore_errors=True)
    r = child([str(folder), str(store)], code=CHILD)
    gz = sum(p.stat().st_size for p in folder.iterdir())
    raw = r["rows"] * 84 * 84
    r.update(gz_bytes=gz, raw_frame_bytes=raw, checkpoint_ram_mb=args.capacity * 84 * 84 / 2**20,
             rows_per_s=r["rows"] / r["wall_s"], frame_mb_per_s=raw / 2**20 / r["wall_s"])
    print(f"{r['checkpoints']} checkpoints of {args.capacity:,} rows, a save every {args.every:,} env steps: "
          f"{r['rows']:,} rows ({r['shared']:,} shared, {r['gaps']} gaps of {r['rows_lost']:,} rows) -> "
          f"{r['steps']:,} steps")
    print(f"import      {r['wall_s']:.1f} s: {r['rows_per_s']:,.0f} rows/s, {r['frame_mb_per_s']:,.0f} MB/s of frames")
    print(f"peak RSS    {r['peak_rss_mb']:,.0f} MB (one checkpoint's observations in RAM: "
          f"{r['checkpoint_ram_mb']:,.0f} MB)")
    print(f"on disk     {gz / 2**20:,.0f} MB of gzip (level 1) -> {r['store_bytes'] / 2**20:,.0f} MB of store "
          f"({raw / 2**20:,.0f} MB of raw frames)")
    save(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
