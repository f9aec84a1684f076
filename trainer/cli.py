"""``replaystore-train``: the DQN agent (agent.py) driven from the command line, in a run directory.
Reads top to bottom like cleanrl's dqn_atari.py: flags -> env -> store -> Q-network -> fit.

Run directory (``--run-dir``)::

    args.json        the flags (``--resume`` reads them back, and records the ones it was given)
    replay.zarr/     the replay store: the replay half of the checkpoint, reopened in place on resume
    checkpoint.npz   weights, optimizer state, step, episode counters, RNG state (replaced atomically)
    tb/              TensorBoard logs (report.py has the tags; TensorFlow or tensorboardX writes them)
    scalars.jsonl    the same scalars as JSON lines (step, time, tags)
    evals.jsonl      one line per evaluation (with --eval-episodes)

Stopping: SIGINT/SIGTERM finish the current step, flush the store, write a checkpoint and exit
(status 128 + signal). After a SIGKILL, ``--resume`` starts from the last checkpoint and keeps every
transition the store committed since; the environment cannot be restored, so the store's episode in
progress is closed as truncated and a new one starts. A run that already took its
``--total-timesteps`` says so and changes nothing; ``--resume RUN --total-timesteps N`` goes on to N.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replaystore import ReplayStore, ReplayStoreError

from . import args as arguments
from . import checkpoint
from .args import Args
from .config import TrainerError
from .envs import default_frame_stack, make_env, make_vector_env
from .rundir import open_store

#: With --num-envs > 1, evaluations play up to this many games at once, on a vector env.
EVAL_ENVS = 32


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    try:
        args, resuming = arguments.parse(argv)
        return train(args, resuming=resuming)
    except (TrainerError, ReplayStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


#: TensorFlow's start-up lines (absl logging from its C++ libraries, which prints them before
#: TF_CPP_MIN_LOG_LEVEL is read, and twice: once per library that links it).
TF_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|To enable the following instructions"
                      r"|[IWE]\d{4} [\d:. ]+\d+ (port|cudart_stub|cpu_feature_guard|cuda_platform|cuda_executor|"
                      r"cuda_fft|cuda_dnn|cuda_blas|computation_placer)\.cc:\d+\])")


@contextlib.contextmanager
def filtered_stderr(noise: re.Pattern[str]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 (by C++ code too) while the block runs, then write
    back every line that ``noise`` does not match."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not noise.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def import_keras() -> Any:
    """Keras and TensorFlow where it is installed (TensorBoard's writer uses it on either backend;
    scalars.py), without TensorFlow's start-up noise: on a machine without a GPU it prints CPU-flag
    notes, "could not find cuda drivers" and an ``E0000 ... failed call to cuInit`` line that reads
    as a failure, each twice. A ``TF_CPP_MIN_LOG_LEVEL`` the user set wins: then everything is
    printed. On JAX without TensorFlow (a GPU box), only Keras."""
    if importlib.util.find_spec("tensorflow") is None:
        import keras
    elif "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        import keras
        import tensorflow  # noqa: F401
    else:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        with filtered_stderr(TF_NOISE):
            import keras
            import tensorflow  # noqa: F401
    return keras


def train(args: Args, *, resuming: bool) -> int:
    env = make_env(args.env_id)  # an unusable id fails here, before anything is written
    try:
        return _train(args, env, resuming=resuming)
    finally:
        env.close()


def _train(args: Args, env: Any, *, resuming: bool) -> int:
    if not args.frame_stack:
        args.frame_stack = default_frame_stack(env.observation_space)
    settings = arguments.config(args)
    run_dir = Path(args.run_dir)
    saved = None
    if resuming:
        checkpoint.remove_partials(run_dir)
        saved = checkpoint.load(run_dir)
    start = int(saved[1]["global_step"]) if saved is not None else 0
    if start < args.total_timesteps and settings.learning_starts >= args.total_timesteps:
        raise TrainerError(f"--learning-starts {settings.learning_starts:,} is not below --total-timesteps "
                           f"{args.total_timesteps:,}: the run would take no gradient step; lower --learning-starts")
    store = open_store(args, env, resuming=resuming)
    try:
        if resuming:
            arguments.save(args, run_dir)  # the flags given now hold for a later plain --resume too
        if args.actors:  # the actor processes write the streams; this one learns from them, read-only
            store.close()
            store = ReplayStore.open(arguments.store_path(args), cache_bytes=args.cache_mb * 2**20,
                                     **arguments.store_options(args))
        return _fit(args, settings, env, store, saved, start, resuming=resuming)
    finally:
        store.close()


def _fit(args: Args, settings: Any, env: Any, store: ReplayStore, saved: Any, start: int, *, resuming: bool) -> int:
    keras = import_keras()  # TensorFlow loads here, once the arguments and the run directory are known to be good

    from .agent import DQN
    from .learner import MAX_GRAD_NORM
    from .models import q_network
    from .report import Report

    run_dir = Path(args.run_dir)
    keras.utils.set_random_seed(args.seed)
    model = q_network((args.frame_stack, *env.observation_space.shape), env.observation_space.dtype,
                      int(env.action_space.n), hidden_sizes=arguments.hidden_sizes(args))
    optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate, global_clipnorm=MAX_GRAD_NORM)
    agent = DQN(model, store, optimizer=optimizer, **dataclasses.asdict(settings))
    if resuming:
        if saved is not None:
            agent.restore(*saved)
        state = agent.state
        print(f"resuming {run_dir} at step {start:,} (epsilon {state.epsilon:.3f}, {agent.train_steps:,} "
              f"gradient steps, {len(store):,} transitions in the store)")
        if start >= args.total_timesteps:
            print(f"nothing to do: the run already took its {start:,} steps (--total-timesteps "
                  f"{args.total_timesteps:,}); to train on, resume with a larger --total-timesteps")
            return 0
        if store.writing:
            store.end_episode()  # the environment cannot be restored: its episode in progress ends as truncated
        store.warm_cache()  # the compressed chunks, up to --cache-mb: ~65 MB and ~1 s for 1M Atari frames
    report = Report(run_dir, total=args.total_timesteps, start=start, progress=args.progress)

    def write_checkpoint() -> None:
        arrays, state = agent.checkpoint_arrays()
        checkpoint.save(run_dir, arrays, state)
        report.writer.flush()

    stop: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _: stop.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    source = envs = None
    try:
        if saved is None:
            write_checkpoint()  # as soon as the networks exist: --resume needs one
        if args.actors:
            from .actors import ActorSource

            source = ActorSource(args, store, agent.learner, start, report.print)
        elif args.num_envs > 1:
            envs = make_vector_env(args.env_id, args.num_envs)
        eval_env = None
        if args.eval_episodes and args.num_envs > 1:  # the games side by side, one per env (up to EVAL_ENVS)
            eval_env = make_vector_env(args.env_id, min(args.eval_episodes, EVAL_ENVS))
        elif args.eval_episodes:
            eval_env = make_env(args.env_id)
        try:
            agent.fit(envs if envs is not None else env, args.total_timesteps, eval_env=eval_env,
                      eval_frequency=args.eval_frequency if args.eval_episodes else 0,
                      eval_episodes=max(1, args.eval_episodes), eval_epsilon=args.eval_epsilon, callbacks=[report],
                      checkpoint_frequency=args.checkpoint_frequency, checkpoint_writer=write_checkpoint,
                      should_stop=lambda: bool(stop), source=source, eval_seed=args.seed + 100_000)
        finally:
            if eval_env is not None:
                eval_env.close()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        report.close()
        if envs is not None:
            envs.close()
    step = agent.state.global_step
    if stop:
        name = signal.Signals(stop[0]).name
        print(f"stopped by {name} at step {step:,}: checkpoint saved and store flushed; "
              f"continue with: replaystore-train --resume {run_dir}")
        return 128 + stop[0]
    print(f"done: {step:,} steps, {agent.train_steps:,} gradient steps; store {arguments.store_path(args)} holds "
          f"{agent.state.stored:,} transitions; peak RSS {peak_rss_mb():,.0f} MB")
    return 0


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
