"""End-to-end trainer throughput: env steps/s and gradient steps/s on an Atari game at replay ratio 8.

For each backend and each N in ``--envs``, ``replaystore-train`` runs on ALE/Breakout-v5 with N
envs (ale-py's vector env for N > 1), batch 32 and train frequency 4 (replay ratio 8), twice:
**lockstep** (``--replay-ratio 0``: one gradient step per 4 env steps, taken inside the loop) and
**decoupled** (the default, ``--replay-ratio 8``: the learner on its own thread, held to the same ratio). Each
run does ``--learning-starts`` steps of random play, then ``--steps`` steps of learning; the table
gives the learning phase's env steps/s (from the steps and wall times of the run's TensorBoard scalars,
leaving out the first 1,000 steps of learning: ``scalars.jsonl``) and gradient steps/s, and the run's peak RSS.

``--overlap off,on`` runs each N > 1 both ways: all N envs stepped at once, and two halves in turn
(``replaystore-train --overlap-envs``, docs/trainer.md).

Run: ``python tools/bench_train.py [--envs 1,4,16] [--backends tensorflow,jax] [--steps 2000]
[--modes lockstep,decoupled] [--overlap off,on] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import save  # noqa: E402


def run(backend: str, n: int, decoupled: bool, overlap: str, args: argparse.Namespace, root: Path) -> dict:
    run_dir = root / f"{backend}-{n}-{'d' if decoupled else 'l'}-{overlap}"
    total = args.learning_starts + args.steps
    cmd = [sys.executable, "-m", "replaystore.trainer.cli", "--env-id", "ALE/Breakout-v5", "--total-timesteps", str(total),
           "--learning-starts", str(args.learning_starts), "--buffer-size", str(args.buffer_size),
           "--num-envs", str(n), "--run-dir", str(run_dir), "--no-progress", "--checkpoint-frequency", str(10**9)]
    cmd += ["--replay-ratio", "8" if decoupled else "0"]
    cmd += ["--steps-per-call", str(args.steps_per_call), "--overlap-envs", overlap]
    if args.sample_threads:
        cmd += ["--sample-threads", str(args.sample_threads)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{backend} N={n} failed:\n{out.stderr[-3000:]}")
    done = re.search(r"done: ([\d,]+) steps, ([\d,]+) gradient steps.*peak RSS ([\d,]+) MB", out.stdout)
    grads = int(done.group(2).replace(",", ""))
    sps = _learning_sps(run_dir, args.learning_starts)
    shutil.rmtree(run_dir, ignore_errors=True)
    learning_s = args.steps / sps if sps else float("nan")
    return {"backend": backend, "envs": n, "mode": "decoupled" if decoupled else "lockstep", "overlap": overlap,
            "env_sps": sps,
            "grad_sps": grads / learning_s if learning_s else float("nan"), "rss_mb": float(done.group(3).replace(",", "")),
            "wall_s": wall}


def _learning_sps(run_dir: Path, learning_starts: int) -> float:
    """Env steps/s after learning started (and its first 1,000 steps, which compile the step): from
    the steps and wall times of the run's scalars (``scalars.jsonl``, trainer/scalars.py)."""
    from replaystore.trainer.scalars import read

    points = {(r["step"], r["time"]) for r in read(run_dir) if r["step"] >= learning_starts + 1000 and "charts/SPS" in r}
    if len(points) < 2:
        return float("nan")
    (s0, t0), (s1, t1) = min(points), max(points)
    return (s1 - s0) / (t1 - t0) if t1 > t0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", default="1,4,16")
    ap.add_argument("--backends", default="tensorflow,jax")
    ap.add_argument("--steps", type=int, default=3000, help="env steps of learning, after learning starts")
    ap.add_argument("--learning-starts", type=int, default=1000)
    ap.add_argument("--buffer-size", type=int, default=100_000)
    ap.add_argument("--steps-per-call", type=int, default=0, help="gradient steps per compiled call (0: the backend's default)")
    ap.add_argument("--modes", default="lockstep,decoupled", help="which loops (a comma list)")
    ap.add_argument("--sample-threads", type=int, default=0, help="the trainer's --sample-threads (0: its default)")
    ap.add_argument("--overlap", default="auto",
                    help="the trainer's --overlap-envs, a comma list to compare (off,on: all envs at once against "
                         "two halves in turn; each N > 1 runs once per value)")
    ap.add_argument("--json", type=Path, help="also write the rows here, as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_train-", dir=os.environ.get("BENCH_DIR")))
    rows = []
    try:
        for backend in args.backends.split(","):
            if importlib.util.find_spec(backend) is None:
                print(f"{backend}: not installed, skipped")
                continue
            for n in (int(x) for x in args.envs.split(",")):
                for decoupled in (mode == "decoupled" for mode in args.modes.split(",")):
                    for overlap in args.overlap.split(",") if n > 1 else ["auto"]:
                        rows.append(run(backend, n, decoupled, overlap, args, root))
                        print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        save(args.json, {"steps": args.steps, "learning_starts": args.learning_starts,
                         "buffer_size": args.buffer_size, "rows": rows})
    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; Breakout, batch 32, "
          f"replay ratio 8, {args.steps:,} steps of learning after {args.learning_starts:,}")
    print("| backend | envs | loop | --overlap-envs | env steps/s | gradient steps/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['envs']} | {r['mode']} | {r['overlap']} | {r['env_sps']:,.0f} | "
              f"{r['grad_sps']:,.1f} | {r['rss_mb']:,.0f} |")


if __name__ == "__main__":
    main()
