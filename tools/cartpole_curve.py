"""CartPole-v1 learning curve: the trainer reaches an average return >= 195 over 20 greedy evaluation
episodes within 100k steps on a CPU, with a fixed seed.

Runs ``replaystore-train`` on CartPole-v1 with the settings below (the defaults are for Atari),
evaluating every ``--eval-frequency`` steps, then prints the curve from the run's evals.jsonl and
the first step at which the average crossed 195. ~5 minutes on 2 cores.

    python tools/cartpole_curve.py [--run-dir runs/cartpole] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

SOLVED = 195.0
SETTINGS = {
    "--total-timesteps": "100000",
    "--learning-rate": "2.5e-4",
    "--buffer-size": "50000",
    "--batch-size": "128",
    "--learning-starts": "1000",
    "--train-frequency": "2",
    "--target-network-frequency": "500",
    "--exploration-fraction": "0.1",
    "--end-e": "0.02",
    "--hidden-sizes": "256,256",
    "--n-step": "3",
    "--eval-episodes": "20",
    "--checkpoint-frequency": "10000",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/cartpole"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-frequency", type=int, default=5000)
    args = ap.parse_args()
    if args.run_dir.exists():
        shutil.rmtree(args.run_dir)
    cmd = [sys.executable, "-m", "trainer.dqn", "--env-id", "CartPole-v1", "--run-dir", str(args.run_dir),
           "--seed", str(args.seed), "--eval-frequency", str(args.eval_frequency), "--no-progress"]
    for flag, value in SETTINGS.items():
        cmd += [flag, value]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc:
        return rc
    evals = [json.loads(line) for line in (args.run_dir / "evals.jsonl").read_text().splitlines()]
    print(f"\nCartPole-v1, seed {args.seed}: average return of 20 greedy evaluation episodes")
    print(f"{'step':>8}  {'mean':>6}  curve (each # = 10)")
    for e in evals:
        print(f"{e['step']:>8,}  {e['mean_return']:6.1f}  {'#' * int(e['mean_return'] // 10)}")
    solved = [e["step"] for e in evals if e["mean_return"] >= SOLVED]
    if solved:
        print(f"\nreached >= {SOLVED:.0f} at step {solved[0]:,} (final: {evals[-1]['mean_return']:.1f})")
        return 0
    print(f"\nnot solved: best {max(e['mean_return'] for e in evals):.1f} < {SOLVED:.0f}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
