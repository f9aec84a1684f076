"""Peak RSS of a whole ``replaystore-train`` process with a 1M-step Atari replay store, full.

Three processes, so each one's peak is its own (this parent stays small):

1. ``replaystore-train --env-id ALE/Breakout-v5 --buffer-size 1000000`` for one step: creates the run;
2. a filler (this script with ``--fill``) tops the run's store up to 1,000,000 transitions of real
   Breakout frames (a 100k-step random-policy recording, tiled; see atari_frames.py);
3. ``replaystore-train --resume`` for ``--steps`` more steps, learning from the full store (Nature
   CNN, batch 32, tf.data prefetching), with its cache warm.

It prints each process's peak RSS (VmHWM, polled and read at exit) beside what an in-RAM buffer of
the same capacity needs, and writes JSON to tools/out/bench_train_memory.json. ~3 minutes.

    python tools/bench_train_memory.py [--steps 4000] [--run-dir tools/out/memory_run]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

CAPACITY = 1_000_000
FRAME_BYTES = 84 * 84
LIMIT_MB = 3 * 1024
OUT = Path(__file__).parent / "out"
sys.path.insert(0, str(Path(__file__).parent))
from harness import peak_rss_mb, save  # noqa: E402


def fill(run_dir: Path, transitions: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from atari_frames import record, replay_into

    from replaystore import ReplayStore

    data = record(100_000)
    with ReplayStore.open(run_dir / "replay.zarr", mode="a") as store:
        store.end_episode()
        t0 = time.perf_counter()
        replay_into(store, data, transitions - len(store))
        print(f"filled to {len(store):,} transitions in {time.perf_counter() - t0:.0f} s")


def run(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd``; its peak RSS in MB (max of VmHWM polls and the trainer's own report) and stdout."""
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    peak = 0.0
    lines: list[str] = []

    def echo() -> None:
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    while proc.poll() is None:
        try:
            peak = max(peak, peak_rss_mb(proc.pid))
        except (OSError, KeyError):
            pass
        time.sleep(0.2)
    reader.join()
    out = "".join(lines)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} exited with {proc.returncode}")
    reported = re.search(r"peak RSS ([\d,]+) MB", out)
    if reported:
        peak = max(peak, float(reported.group(1).replace(",", "")))
    return peak, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4000, help="training steps on the full store")
    ap.add_argument("--run-dir", type=Path, default=OUT / "memory_run")
    ap.add_argument("--fill", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fill:
        fill(args.fill, CAPACITY)
        return 0
    if args.run_dir.exists():
        shutil.rmtree(args.run_dir)
    train = [sys.executable, "-m", "replaystore.trainer.cli"]
    empty_mb, _ = run([*train, "--env-id", "ALE/Breakout-v5", "--buffer-size", str(CAPACITY), "--total-timesteps", "1",
                       "--learning-starts", "0", "--run-dir", str(args.run_dir), "--no-progress"])
    fill_mb, _ = run([sys.executable, __file__, "--fill", str(args.run_dir)])
    full_mb, out = run([*train, "--resume", str(args.run_dir), "--total-timesteps", str(1 + args.steps),
                        "--no-progress"])
    disk = sum(p.stat().st_size for p in (args.run_dir / "replay.zarr").rglob("*") if p.is_file())
    ring_mb = CAPACITY * FRAME_BYTES / 2**20
    deque_mb = CAPACITY * 2 * 4 * FRAME_BYTES / 2**20
    result = {
        "capacity": CAPACITY, "train_steps_on_full_store": args.steps,
        "peak_rss_mb": {"trainer, empty store": round(empty_mb), "filler": round(fill_mb),
                        "trainer, full store": round(full_mb)},
        "store_bytes_on_disk": disk,
        "in_ram_mb": {"numpy ring, frames once": round(ring_mb), "deque of (s, a, r, s', done), 4-frame stacks": round(deque_mb)},
        "limit_mb": LIMIT_MB,
    }
    print(f"\n1M-capacity ALE/Breakout-v5 run ({args.steps:,} training steps on the full store)")
    print(f"{'process':<44} {'peak RSS':>10}")
    for name, mb in result["peak_rss_mb"].items():
        print(f"{name:<44} {mb:>7,} MB")
    print(f"{'store on disk':<44} {disk / 2**20:>7,.0f} MB")
    print("in-RAM buffers of the same capacity (frames alone, before TensorFlow):")
    for name, mb in result["in_ram_mb"].items():
        print(f"  {name:<42} {mb:>7,} MB")
    verdict = "within" if full_mb <= LIMIT_MB else "OVER"
    print(f"\ntrainer with a full 1M store: {full_mb:,.0f} MB peak RSS, {verdict} the {LIMIT_MB:,} MB budget "
          f"({full_mb / ring_mb:.2f}x the frames-once ring's frames alone)")
    OUT.mkdir(exist_ok=True)
    save(OUT / "bench_train_memory.json", result)
    return 0 if full_mb <= LIMIT_MB else 1


if __name__ == "__main__":
    sys.exit(main())
