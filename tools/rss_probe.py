"""Where the trainer's resident memory goes, stage by stage, in one process: the interpreter, the
Keras backend started (on JAX: the GPU client), the Nature CNN and its learner compiled and one
call taken, a 1M-step store opened and the learner's feed started (blocks sampled), a vector env of
``--envs`` Atari games. Prints VmRSS and VmHWM (MB) after each stage, and writes them to ``--json``.

Run: ``python tools/rss_probe.py [--store tools/out/bench_learner.zarr] [--envs 16]`` (the store
is the one tools/bench_learner.py builds; without it the feed stage is left out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from harness import memory, save  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=Path(__file__).parent / "out" / "bench_learner.zarr")
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    stages: list[tuple[str, dict[str, float]]] = []

    def note(stage: str) -> None:
        stages.append((stage, memory()))
        print(f"{stage:<40} RSS {stages[-1][1]['VmRSS']:>8,.0f} MB   peak {stages[-1][1]['VmHWM']:>8,.0f} MB", flush=True)

    note("python, numpy")
    import keras

    keras.ops.convert_to_numpy(keras.ops.ones((1,)) + 1)
    note(f"keras on {keras.backend.backend()}, backend started")
    from replaystore import ReplayStore
    from replaystore.trainer.config import DQNConfig
    from replaystore.trainer.feeding import Learning
    from replaystore.trainer.learner import MAX_GRAD_NORM, make_learner
    from replaystore.trainer.models import nature_cnn
    from replaystore.trainer.state import RunState

    stack = (4, 84, 84)
    config = DQNConfig(batch_size=32, learning_starts=0, sample_threads=args.threads)
    config.fill(images=True)  # (the rest: cleanrl's Atari settings)
    learner = make_learner(nature_cnn(stack, 4), keras.optimizers.Adam(1e-4, global_clipnorm=MAX_GRAD_NORM),
                           stack_shape=stack, dtype=np.uint8, target_every=config.target_every(), tau=1.0)
    learner.act_batch(np.zeros((args.envs, *stack), np.uint8))
    note("model, learner, act compiled")
    if args.store.exists():
        store = ReplayStore.open(args.store)
        note("store opened")
        learning = Learning(config, store, learner, RunState())
        learning.start(0)
        for _ in range(20):
            learning.steps(learning.steps_per_call)
        note(f"feed started, {20 * learning.steps_per_call} gradient steps")
        for _ in range(50):
            learning.steps(learning.steps_per_call)
        note(f"{70 * learning.steps_per_call} gradient steps")
    from replaystore.trainer.envs import make_vector_env

    envs = make_vector_env("ALE/Pong-v5", args.envs)
    envs.reset(seed=0)
    for _ in range(100):
        envs.step(np.zeros(args.envs, np.int64))
    note(f"{args.envs} Atari envs stepped")
    if args.json:
        save(args.json, dict(stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
