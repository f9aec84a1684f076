"""Learning curves of the trainer: does it learn, how fast, on each Keras backend.

Runs ``replaystore-train`` on a preset below once per backend (``KERAS_BACKEND``), evaluating
``--eval-episodes`` greedy episodes every ``--eval-frequency`` steps, and writes, under ``--out``:

- ``<env>-<backend>-<seed>.json``: the settings, the machine, the wall time, and the curve (per
  evaluation: env step, mean return, wall seconds since the start, seconds spent evaluating);
- ``<env>-<seed>.png``: every backend's curve on one chart (its evaluations, and its training games'
  returns between them), the goal as a line.

It prints each curve and the first step (and wall time) at which the mean return reached the goal.
The exit status is 0 when every backend reached it within the preset's steps, 1 when one did not,
2 when a run failed.

``--api`` (CartPole only) runs the Python API instead of the command line: ``DQN.fit`` with the
preset's hyperparameters on two user models, a functional one with a ``Rescaling`` layer and a
dueling head, and a subclassed one (two hidden layers of 256), each on every backend, evaluated
by a callback every ``--eval-frequency`` steps; the curves are named ``<env>-<model>-<backend>``.

Presets (``--env-id``):

- ``CartPole-v1``: goal 195 (mean of 20 episodes) within 100k steps; ~5-10 minutes per backend on
  2 CPU cores.
- ``ALE/Pong-v5``: goal +18 raw score (mean of 20 games) within 2M env steps, 32 envs; for a GPU
  machine (hours on a CPU; reached +18.4 at 2M steps in 10.2 minutes on one H100);
  tools/gpu_suite.py runs it with ``--stop-at-goal --resume``.

    python tools/learning_curve.py [--env-id CartPole-v1] [--backends tensorflow,jax] [--seed 1]
        [--out tools/out/curves] [--api] [--resume] [--stop-at-goal] [-- extra trainer flags, e.g. --replay-ratio 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
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
    # Pong for speed to +18 on one GPU box (issue 33): n-step 3 and a short exploration (200k steps)
    # for sample efficiency, 32 envs side by side (AtariVectorEnv, two halves in turn) and the
    # decoupled learner at replay ratio 16 (a gradient step per 2 env steps: at ratio 8 the learner
    # waited for the envs half of both GPU runs); evaluations of 20 games on 20 envs at once, every
    # 400k steps (every 125k, they took 30% of the first run's wall time).
    "ALE/Pong-v5": {
        "goal": 18.0,
        "flags": {
            "--total-timesteps": "2000000", "--num-envs": "32", "--learning-rate": "1e-4",
            "--buffer-size": "1000000", "--batch-size": "32", "--learning-starts": "20000",
            "--train-frequency": "2", "--target-network-frequency": "2000", "--exploration-fraction": "0.1",
            "--end-e": "0.01", "--n-step": "3", "--eval-episodes": "20", "--eval-frequency": "400000",
            "--checkpoint-frequency": "400000", "--sample-threads": "4", "--overlap-envs": "on",
        },
    },
}


#: ``--api``: the user models (built in the child process, ``api_child``)
API_MODELS = ("functional-dueling", "subclassed")


def api_child(kind: str, run_dir: Path, seed: int) -> None:
    """One ``DQN.fit`` on CartPole with a user model, evaluations to ``run_dir/evals.jsonl``."""
    import gymnasium as gym
    import keras
    from keras import layers

    from replaystore.trainer import DQN, Dueling

    flags = PRESETS["CartPole-v1"]["flags"]

    @keras.saving.register_keras_serializable(package="learning_curve")
    class TwoLayers(keras.Model):
        def __init__(self, n_actions: int, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.n_actions = n_actions
            self.hidden = [layers.Dense(256, activation="relu"), layers.Dense(256, activation="relu")]
            self.out = layers.Dense(n_actions)

        def call(self, stacks: object) -> object:
            x = keras.ops.reshape(keras.ops.cast(stacks, "float32"), (-1, 4))
            for layer in self.hidden:
                x = layer(x)
            return self.out(x)

        def get_config(self) -> dict:
            return {**super().get_config(), "n_actions": self.n_actions}

    keras.utils.set_random_seed(seed)
    if kind == "functional-dueling":
        inputs = keras.Input((1, 4))
        x = layers.Flatten()(layers.Rescaling(1.0)(inputs))
        x = layers.Dense(256, activation="relu")(layers.Dense(256, activation="relu")(x))
        model = keras.Model(inputs, Dueling(2)(x))
    else:
        model = TwoLayers(2)

    class Evals(keras.callbacks.Callback):
        def on_evaluation(self, step: int, logs: dict) -> None:
            with open(run_dir / "evals.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "mean_return": logs["mean_return"], "time": time.time(),
                                    "eval_s": logs["eval_s"]}) + "\n")

    run_dir.mkdir(parents=True, exist_ok=True)
    agent = DQN(model, run_dir / "replay.zarr", buffer_size=int(flags["--buffer-size"]), seed=seed,
                learning_rate=float(flags["--learning-rate"]), batch_size=int(flags["--batch-size"]),
                learning_starts=int(flags["--learning-starts"]), train_frequency=int(flags["--train-frequency"]),
                target_network_frequency=int(flags["--target-network-frequency"]),
                exploration_fraction=float(flags["--exploration-fraction"]), end_e=float(flags["--end-e"]),
                n_step=int(flags["--n-step"]))
    agent.fit(gym.make("CartPole-v1"), int(flags["--total-timesteps"]), eval_env=gym.make("CartPole-v1"),
              eval_frequency=int(flags["--eval-frequency"]), eval_episodes=int(flags["--eval-episodes"]),
              callbacks=[Evals()], checkpoint_dir=run_dir / "agent", checkpoint_frequency=10_000)
    agent.close()


def run_one(env_id: str, backend: str, seed: int, out: Path, extra: list[str], api: str = "", *,
            resume: bool = False, stop_at_goal: bool = False) -> dict:
    preset = PRESETS[env_id]
    name = f"{env_id.replace('/', '_')}-{api + '-' if api else ''}{backend}-{seed}"
    run_dir = out / name
    started = out / f"{name}.started"  # the wall clock of the run's first start: a resumed run's times count from it
    if resume and not api and (run_dir / "args.json").exists() and started.exists():
        cmd = [sys.executable, "-m", "replaystore.trainer.cli", "--resume", str(run_dir), "--no-progress"]
        start = float(started.read_text())
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        if api:
            cmd = [sys.executable, __file__, "--api-child", api, "--run-dir", str(run_dir), "--seed", str(seed)]
        else:
            cmd = [sys.executable, "-m", "replaystore.trainer.cli", "--env-id", env_id, "--run-dir", str(run_dir),
                   "--seed", str(seed), "--no-progress"]
            for flag, value in preset["flags"].items():
                cmd += [flag, value]
            cmd += extra
        start = time.time()
        started.write_text(repr(start))
    print(f"$ KERAS_BACKEND={backend}", " ".join(cmd), flush=True)
    child = subprocess.Popen(cmd, env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    stopped = False
    while child.poll() is None:
        time.sleep(2)
        if stop_at_goal and not stopped and any(e["mean_return"] >= preset["goal"] for e in evaluations(run_dir)):
            child.send_signal(signal.SIGTERM)  # the trainer checkpoints, flushes and exits 143
            stopped = True
    wall = time.time() - start
    # (stopped: the trainer exits 143 after its checkpoint; a signal that comes as a finished run is
    # already tearing down, after its handlers are gone, ends it by the signal itself: -15)
    if child.returncode and not (stopped and child.returncode in (128 + signal.SIGTERM, -signal.SIGTERM)):
        print(f"the {backend} run failed (exit {child.returncode}); its logs are in {run_dir}", file=sys.stderr)
        raise SystemExit(2)
    curve = [{"step": e["step"], "mean_return": e["mean_return"], "returns": e.get("returns"), "wall_s": e["time"] - start,
              "eval_s": e.get("eval_s")} for e in evaluations(run_dir)]
    reached = next((c for c in curve if c["mean_return"] >= preset["goal"]), None)
    return {"env_id": env_id, "backend": backend, "model": api or "cli", "name": name, "seed": seed, "goal": preset["goal"],
            "flags": {**preset["flags"], "extra": " ".join(extra)}, "wall_s": wall, "curve": curve,
            "train_curve": training_returns(run_dir),
            "stopped_at_goal": stopped, "reached_at_step": reached and reached["step"],
            "reached_at_wall_s": reached and reached["wall_s"], "machine": machine(), "run_dir": str(run_dir)}


def evaluations(run_dir: Path) -> list[dict]:
    """The run's evaluations so far (evals.jsonl; a line being written is left out)."""
    from replaystore.trainer.scalars import read_lines

    return read_lines(run_dir / "evals.jsonl")


def training_returns(run_dir: Path, window: int = 32, points: int = 200) -> list[list[float]]:
    """The training games' returns (epsilon-greedy, ``scalars.jsonl``) as [env step, mean of the last
    ``window`` games], at most ``points`` of them: the curve between two evaluations."""
    from replaystore.trainer.scalars import read_lines

    games = [(s["step"], s["charts/episodic_return"]) for s in read_lines(run_dir / "scalars.jsonl")
             if "charts/episodic_return" in s]
    if not games:
        return []
    import numpy as np

    width = min(window, len(games))
    means = np.convolve([r for _, r in games], np.ones(width) / width, mode="valid")  # means[i]: games i .. i+width-1
    every = max(1, -(-len(means) // points))
    picks = sorted({*range(0, len(means), every), len(means) - 1})
    return [[games[i + width - 1][0], float(means[i])] for i in picks]


def machine() -> str:
    text = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
    try:  # (nvidia-smi, not jax: importing jax here would take the GPU's memory from the runs)
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=30).stdout.strip().splitlines()
        return f"{gpu[0]}, {text}" if gpu else text
    except (OSError, subprocess.SubprocessError):
        return text


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        label = r["backend"] if r["model"] == "cli" else f"{r['model']}, {r['backend']}"
        line, = ax.plot([c["step"] for c in r["curve"]], [c["mean_return"] for c in r["curve"]], marker="o",
                        label=f"{label}: greedy evaluations")
        if r.get("train_curve"):
            ax.plot(*zip(*r["train_curve"]), color=line.get_color(), alpha=0.35, linewidth=1,
                    label=f"{label}: training games (epsilon-greedy), mean of the last 32")
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
    ap.add_argument("--api", action="store_true", help="the Python API on two user models instead of the command line")
    ap.add_argument("--resume", action="store_true", help="continue a run directory left by a run that was cut off "
                    "(its times count from its first start)")
    ap.add_argument("--stop-at-goal", action="store_true", help="stop a run (SIGTERM: checkpoint, then exit) at its "
                    "first evaluation at or above the goal")
    ap.add_argument("--api-child", choices=API_MODELS, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.api_child:
        api_child(args.api_child, args.run_dir, args.seed)
        return 0
    if args.api and args.env_id != "CartPole-v1":
        raise SystemExit("--api has a CartPole-v1 preset only")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for api in API_MODELS if args.api else ("",):
        for backend in args.backends.split(","):
            if importlib.util.find_spec(backend) is None:
                print(f"{backend}: not installed, skipped")
                continue
            result = run_one(args.env_id, backend, args.seed, args.out, extra, api, resume=args.resume,
                             stop_at_goal=args.stop_at_goal)
            (args.out / f"{result['name']}.json").write_text(json.dumps(result, indent=1) + "\n")
            results.append(result)
    if not results:
        return 1
    png = args.out / f"{args.env_id.replace('/', '_')}-{'api-' if args.api else ''}{args.seed}.png"
    plot(results, png)
    print(f"\n{args.env_id}, seed {args.seed}, {results[0]['machine']}; the curves are in {args.out}, the chart {png}")
    print("| run | " + " | ".join(f"{c['step']:,}" for c in results[0]["curve"]) + " |")
    print("|---|" + "---|" * len(results[0]["curve"]))
    for r in results:
        print(f"| {r['name']} | " + " | ".join(f"{c['mean_return']:.0f}" for c in r["curve"]) + " |")
    ok = True
    for r in results:
        if r["reached_at_step"] is None:
            ok = False
            print(f"{r['name']}: did not reach {r['goal']:g} (best {max(c['mean_return'] for c in r['curve']):.1f}); "
                  f"{r['wall_s'] / 60:.1f} min")
        else:
            print(f"{r['name']}: reached {r['goal']:g} at step {r['reached_at_step']:,} after "
                  f"{r['reached_at_wall_s'] / 60:.1f} min (whole run {r['wall_s'] / 60:.1f} min)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
