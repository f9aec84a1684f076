"""Does the README's Keras example learn? Runs README.md's DQN block exactly as written (only its
seed given: ``keras.utils.set_random_seed(seed)`` and ``DQN(..., seed=seed)``), on each backend and
seed, each in its own folder and process, and scores the agent the block leaves the user with (its
last line's) over ``--episodes`` greedy CartPole games. Goal: a mean >= 195 on at least 9 of 10
seeds on each backend. docs/benchmarks.md, "CartPole across seeds", has the table.

    python tools/readme_seeds.py --out tools/out/readme_seeds.jsonl [--seeds 1,...,10]
        [--backends tensorflow,jax] [--jobs 2] [--steps 100000]

``--steps`` other than the README's 100,000 is for a rehearsal (the block's total_timesteps).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seeds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOAL = 195.0


def readme_block() -> str:
    """README.md's python block that fits a DQN (the trainer's example)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    found = [b for b in blocks if "from replaystore.trainer import DQN" in b and ".fit(" in b]
    if len(found) != 1:
        raise SystemExit(f"README.md has {len(found)} python blocks that fit a DQN, not 1")
    return found[0]


def child(run: dict) -> None:
    import os

    os.chdir(tempfile.mkdtemp(prefix="readme-seed-"))
    import gymnasium as gym
    import keras

    code = readme_block()
    seeded = code.replace("buffer_size=50_000)", f"buffer_size=50_000, seed={run['seed']})")
    if seeded == code:
        raise SystemExit("the README's DQN(...) call no longer ends in buffer_size=50_000): update this tool")
    if run["steps"] != 100_000:
        seeded = seeded.replace("total_timesteps=100_000", f"total_timesteps={run['steps']}")
    keras.utils.set_random_seed(run["seed"])
    namespace: dict = {"__name__": "__main__"}
    t0 = time.perf_counter()
    exec(compile(seeded, "README.md", "exec"), namespace)  # noqa: S102
    fit_s = time.perf_counter() - t0
    agent = namespace["agent"]
    returns = agent.evaluate(gym.make("CartPole-v1"), episodes=run["episodes"], seed=10_000 + run["seed"])
    best = agent.best[1] if agent.best is not None else {}
    print(json.dumps({"score": float(sum(returns) / len(returns)), "holds": agent.holds,
                      "best_step": best.get("step"), "best_eval": best.get("mean_return"),
                      "steps": agent.state.global_step, "fit_s": round(fit_s, 1), "backend": keras.backend.backend()}))


def main() -> int:
    p = seeds.parser(__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="tensorflow,jax")
    p.add_argument("--steps", type=int, default=100_000)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    runs = [{"backend": b, "seed": int(s), "steps": args.steps, "episodes": args.episodes}
            for s in args.seeds.split(",") for b in args.backends.split(",")]  # (seed by seed: both backends go on)
    rows = seeds.run_all(Path(__file__), runs, args.out, args.jobs,
                         env=lambda run: {"KERAS_BACKEND": run["backend"], "TF_CPP_MIN_LOG_LEVEL": "3"})
    print(f"\nREADME.md's DQN example, {args.steps:,} env steps, mean of {args.episodes} greedy games:\n")
    print(seeds.table(rows, ["backend"], goal=GOAL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
