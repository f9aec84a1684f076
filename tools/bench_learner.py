"""The learner fed by the store against the learner's own bound, per Keras backend.

For each installed backend (TensorFlow, JAX, PyTorch), in a child process with ``KERAS_BACKEND`` set, the
trainer's DQN learner (Nature CNN, double-DQN, Adam; batch 32 of 4-frame 84x84 Breakout stacks)
takes gradient steps in interleaved rounds:

  bound  on one fixed block of K batches already in the backend's hands (on the device for JAX,
         tensors for TensorFlow and PyTorch), one call of K gradient steps per block, so nothing is
         sampled;
  fed    on blocks sampled from a 1M-transition store through the product's path, exactly as
         the trainer takes them (trainer/feeding.py: JAX ``store.jax_blocks`` with a feeder thread,
         TensorFlow ``store.as_dataset``, with ``blocks=True`` when K > 1, PyTorch ``store.blocks``).

K is each of ``--steps-per-call`` (a comma list) in turn.

It prints gradient steps/s for both and the ratio fed / bound (the issue's goal: >= 0.9), and
writes them to ``--json``. Run: ``python tools/bench_learner.py [--seconds 10] [--rounds 2]
[--reuse]``. The store is built once from a recorded Breakout game tiled to ``--transitions``
(tools/out/bench_learner.zarr). It runs the learner of either trainer: the one API
(``replaystore.trainer``: ``make_learner``, ``Learning``) or, with an older checkout first on
``PYTHONPATH``, the agents before it (``trainer.dqn.make_agent``); tools/ab.py runs both in turn::

    python tools/ab.py --old 4062a29 --json tools/out/bench_learner.json --rounds 2 -- \
        python tools/bench_learner.py --reuse --seconds 8 --rounds 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record, replay_into  # noqa: E402
from harness import child as run_child  # noqa: E402
from harness import median, save  # noqa: E402

STORE = OUT / "bench_learner.zarr"
BATCH = 32


def build_store(transitions: int, recorded: int) -> None:
    import gymnasium as gym

    from replaystore import ReplayStore

    shutil.rmtree(STORE, ignore_errors=True)
    store = ReplayStore.create(STORE, transitions, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4)
    replay_into(store, record(recorded), transitions)
    store.close()


def child(args: argparse.Namespace) -> dict:
    """Runs in a process whose ``KERAS_BACKEND`` is set: rounds of bound and fed, steps/s of each."""
    import keras

    from replaystore import ReplayStore

    backend = keras.backend.backend()
    store = ReplayStore.open(STORE)
    k = int(args.steps_per_call)
    if importlib.util.find_spec("replaystore.trainer") is None:  # the trainer before the API (an older checkout)
        learning, agent = old_learner(store, k, args.threads, backend)
    else:
        from replaystore.trainer.config import DQNConfig
        from replaystore.trainer.feeding import Learning
        from replaystore.trainer.learner import MAX_GRAD_NORM, make_learner
        from replaystore.trainer.models import nature_cnn
        from replaystore.trainer.state import RunState

        config = DQNConfig(batch_size=BATCH, steps_per_call=k, sample_threads=args.threads, seed=0, learning_starts=0)
        config.fill(images=True)  # (the rest: cleanrl's Atari settings)
        stack_shape = (4, *store.observation_space.shape)
        agent = make_learner(nature_cnn(stack_shape, int(store.action_space.n)),
                             keras.optimizers.Adam(1e-4, global_clipnorm=MAX_GRAD_NORM), stack_shape=stack_shape,
                             dtype=store.observation_space.dtype, target_every=config.target_every(), tau=1.0)
        learning = Learning(config, store, agent, RunState())
    learning.start(0)
    per_call = learning.steps_per_call
    host = store.sample(BATCH * per_call, rng=np.random.default_rng(1))
    fixed = {name: np.asarray(getattr(host, name)).reshape(per_call, BATCH, *np.shape(getattr(host, name))[1:])
             for name in ("obs", "next_obs", "action", "reward", "discount", "weight", "index")}
    if backend == "jax":
        import jax

        on_device = jax.device_put({n: v for n, v in fixed.items() if n != "index"})
    elif backend == "torch":
        import torch

        device = agent.device if hasattr(agent, "device") else None
        on_device = {n: torch.as_tensor(v, device=device) for n, v in fixed.items()}
    else:
        import tensorflow as tf

        on_device = {n: tf.constant(v) for n, v in fixed.items()}

    def bound_call() -> None:
        agent.train_block(on_device)

    def fed_call() -> None:
        learning.steps(per_call)

    def rate(call: object, seconds: float) -> float:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            call()
            calls += 1
        return calls * per_call / (time.perf_counter() - t0)

    rate(bound_call, 2.0)  # compile and warm up both
    rate(fed_call, 2.0)
    bound, fed = [], []
    for _ in range(args.rounds):
        bound.append(rate(bound_call, args.seconds))
        fed.append(rate(fed_call, args.seconds))
    learning.close()
    store.close()
    return {"backend": backend, "bound": (median(bound)), "fed": (median(fed)),
            "steps_per_call": per_call}


def old_learner(store: object, k: int, threads: int, backend: str) -> tuple[object, object]:
    """The learning and agent of the trainer before its API (trainer.dqn, trainer.learn)."""
    from trainer.dqn import make_agent
    from trainer.learn import Learning

    ns = argparse.Namespace(frame_stack=4, learning_rate=1e-4, hidden_sizes="120,84", target_network_frequency=1000,
                            train_frequency=4, tau=1.0, steps_per_call=k, batch_size=BATCH,
                            n_step=1, gamma=0.99, prioritized=False, alpha=0.6, beta=0.4, sample_threads=threads, seed=0)
    env = argparse.Namespace(observation_space=store.observation_space, action_space=store.action_space)
    agent = make_agent(ns, env, backend)

    class Quiet:
        def trained(self, *a: object) -> None:
            pass

    return Learning(ns, store, agent, Quiet(), {}), agent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=1_000_000)
    ap.add_argument("--recorded", type=int, default=100_000, help="steps of a random Breakout game, tiled into the store")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps-per-call", default="1,8,32", help="gradient steps per compiled call (a comma list)")
    ap.add_argument("--threads", type=int, default=2, help="sampling threads (and decode processes)")
    ap.add_argument("--reuse", action="store_true", help="reuse tools/out/bench_learner.zarr if it exists")
    ap.add_argument("--backends", default="tensorflow,jax")
    ap.add_argument("--json", type=Path, default=OUT / "bench_learner.json", help="where the table goes as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if not (args.reuse and STORE.exists()):
        t0 = time.perf_counter()
        build_store(args.transitions, args.recorded)
        print(f"built {STORE} ({args.transitions:,} transitions) in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for backend in args.backends.split(","):
        if importlib.util.find_spec(backend) is None:
            print(f"{backend}: not installed, skipped")
            continue
        for k in args.steps_per_call.split(","):
            cmd = [sys.executable, __file__, "--child", "--seconds", str(args.seconds), "--rounds", str(args.rounds),
                   "--steps-per-call", k, "--threads", str(args.threads)]
            rows.append(run_child(cmd[1:], env={"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}))
            print(f"{backend}: {rows[-1]}", flush=True)
    save(args.json, {f"{r['backend']}/k{r['steps_per_call']}": {
        "bound": r["bound"], "fed": r["fed"], "fed_over_bound": r["fed"] / r["bound"]} for r in rows})
    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; batch {BATCH}, "
          f"median of {args.rounds} rounds of {args.seconds:.0f} s")
    print("| backend | steps per call | bound: fixed batch, steps/s | fed by the store, steps/s | fed / bound |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['steps_per_call']} | {r['bound']:,.1f} | {r['fed']:,.1f} | "
              f"{r['fed'] / r['bound']:.2f} |")


if __name__ == "__main__":
    main()
