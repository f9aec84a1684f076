"""Learning curves of the trainer: does it learn, how fast, on each Keras backend.

Runs ``replaystore-train`` on a preset below once per backend (``KERAS_BACKEND``), evaluating
``--eval-episodes`` greedy episodes every ``--eval-frequency`` steps, and writes, under ``--out``:

- ``<env>-<backend>-<seed>.json``: the settings, the machine, the wall time, and the curve (per
  evaluation: env step, mean return, wall seconds since the start, seconds spent evaluating);
- ``<env>-<seed>.png``: every backend's curve on one chart, the goal as a line.

It prints each curve and the first step (and wall time) at which the mean return reached the goal.
The exit status is 0 only when every backend reached it within the preset's steps.

Presets (``--env-id``):

- ``CartPole-v1``: goal 195 (mean of 20 episodes) within 100k steps; ~5-10 minutes per backend on
  2 CPU cores.
- ``ALE/Pong-v5``: goal +18 raw score (mean of 20 episodes) within 2M env steps, 16 envs; for a
  GPU machine (hours on a CPU).

    python tools/learning_curve.py [--env-id CartPole-v1] [--backends tensorflow,jax] [--seed 1]
        [--out tools/out/curves] [-- extra trainer flags, e.g. --replay-ratio 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

PRESETS: dict[str, dict] = {
    "CartPole-v1": {
        "goal": 195.0,
        "flags": {
            "--total-timesteps": "100000", "--learning-rate": "2.5e-4", "--buffer-size": "50000",
            "--batch-size": "128", "--learning-starts": "1000", "--train-frequency": "2",
            "--target-network-frequency": "500", "--exploration-fraction": "0.1", "--end-e": "0.02",
            "--hidden-sizes": "256,256", "--n-step": "3", "--eval-episodes": "20", "--eval-frequency": "5000",
            "--checkpoint-frequency": "10000",
        },
    },
    "ALE/Pong-v5": {
        "goal": 18.0,
        "flags": {
            "--total-timesteps": "2000000", "--num-envs": "16", "--learning-rate": "1e-4",
            "--buffer-size": "1000000", "--batch-size": "32", "--learning-starts": "20000",
            "--train-frequency": "4", "--target-network-frequency": "1000", "--exploration-fraction": "0.05",
            "--end-e": "0.01", "--n-step": "3", "--eval-episodes": "20", "--eval-frequency": "100000",
            "--checkpoint-frequency": "200000",
        },
    },
}


def run_one(env_id: str, backend: str, seed: int, out: Path, extra: list[str]) -> dict:
    preset = PRESETS[env_id]
    run_dir = out / f"{env_id.replace('/', '_')}-{backend}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "trainer.dqn", "--env-id", env_id, "--run-dir", str(run_dir), "--seed", str(seed),
           "--no-progress"]
    for flag, value in preset["flags"].items():
        cmd += [flag, value]
    cmd += extra
    print(f"$ KERAS_BACKEND={backend}", " ".join(cmd), flush=True)
    start = time.time()
    rc = subprocess.call(cmd, env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    wall = time.time() - start
    if rc:
        raise SystemExit(f"the {backend} run failed (exit {rc}); its logs are in {run_dir}")
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    curve = [{"step": e["step"], "mean_return": e["mean_return"], "wall_s": e["time"] - start,
              "eval_s": e["eval_s"]} for e in evals]
    reached = next((c for c in curve if c["mean_return"] >= preset["goal"]), None)
    return {"env_id": env_id, "backend": backend, "seed": seed, "goal": preset["goal"],
            "flags": {**preset["flags"], "extra": " ".join(extra)}, "wall_s": wall, "curve": curve,
            "reached_at_step": reached and reached["step"], "reached_at_wall_s": reached and reached["wall_s"],
            "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}", "run_dir": str(run_dir)}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot([c["step"] for c in r["curve"]], [c["mean_return"] for c in r["curve"]], marker="o", label=r["backend"])
    ax.axhline(results[0]["goal"], color="gray", linestyle="--", label=f"goal {results[0]['goal']:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"mean return, {PRESETS[results[0]['env_id']]['flags']['--eval-episodes']} greedy episodes")
    ax.set_title(f"{results[0]['env_id']}, seed {results[0]['seed']} ({results[0]['machine']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-id", default="CartPole-v1", choices=sorted(PRESETS))
    ap.add_argument("--backends", default="tensorflow,jax")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "curves")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for backend in args.backends.split(","):
        if importlib.util.find_spec(backend) is None:
            print(f"{backend}: not installed, skipped")
            continue
        result = run_one(args.env_id, backend, args.seed, args.out, extra)
        name = f"{args.env_id.replace('/', '_')}-{backend}-{args.seed}.json"
        (args.out / name).write_text(json.dumps(result, indent=1) + "\n")
        results.append(result)
    if not results:
        return 1
    png = args.out / f"{args.env_id.replace('/', '_')}-{args.seed}.png"
    plot(results, png)
    print(f"\n{args.env_id}, seed {args.seed}, {results[0]['machine']}; the curves are in {args.out}, the chart {png}")
    print("| backend | " + " | ".join(f"{c['step']:,}" for c in results[0]["curve"]) + " |")
    print("|---|" + "---|" * len(results[0]["curve"]))
    for r in results:
        print(f"| {r['backend']} | " + " | ".join(f"{c['mean_return']:.0f}" for c in r["curve"]) + " |")
    ok = True
    for r in results:
        if r["reached_at_step"] is None:
            ok = False
            print(f"{r['backend']}: did not reach {r['goal']:g} (best {max(c['mean_return'] for c in r['curve']):.1f}); "
                  f"{r['wall_s'] / 60:.1f} min")
        else:
            print(f"{r['backend']}: reached {r['goal']:g} at step {r['reached_at_step']:,} after "
                  f"{r['reached_at_wall_s'] / 60:.1f} min (whole run {r['wall_s'] / 60:.1f} min)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
