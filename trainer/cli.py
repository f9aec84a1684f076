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

``--offline STORE`` learns from an existing store instead (``fit_offline``, offline.py): the store
is opened read-only and stays where it is (no ``replay.zarr/`` in the run directory), the run is
``--gradient-steps`` long, checkpoints and evaluations count gradient steps, and the env
(``--env-id``) is only evaluated on. Stopping and resuming work as above. ``--init-from RUN_DIR``
starts a new run, online or offline, from an earlier run's weights (pretrain offline, fine-tune
online).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replaystore import ReplayStore, ReplayStoreError

from . import args as arguments
from . import checkpoint, cmdline
from .args import Args
from .config import FLAGS, TrainerError
from .envs import default_frame_stack, env_spaces, make_env, make_vector_env
from .evalrun import evaluate_run, evaluation_env
from .process import import_keras, peak_rss_mb, stop_signals
from .rundir import lease_wait, new_run_dir, open_store
from .stores import check_dataset, open_to_read


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    try:
        command = cmdline.parse(argv)
        if command.mode == "evaluate":
            return evaluate_run(command.args, video=command.video, best=command.best)
        return train(command.args, resuming=command.mode == "resume")
    except (TrainerError, ReplayStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def train(args: Args, *, resuming: bool) -> int:
    if args.offline:
        return train_offline(args, resuming=resuming)
    env = make_env(args.env_id, arguments.env_kwargs(args))  # an unusable id fails here, before anything is written
    try:
        return _train(args, env, resuming=resuming)
    finally:
        env.close()


def _train(args: Args, env: Any, *, resuming: bool) -> int:
    if not args.frame_stack:
        args.frame_stack = default_frame_stack(env.observation_space)
    arguments.fill_presets(args, env.observation_space)
    settings = arguments.config(args)
    run_dir = Path(args.run_dir)
    saved = _saved(run_dir) if resuming else None
    start = int(saved[1]["global_step"]) if saved is not None else 0
    if start < args.total_timesteps and settings.learning_starts >= args.total_timesteps:
        raise TrainerError(f"--learning-starts {settings.learning_starts:,} is not below --total-timesteps "
                           f"{args.total_timesteps:,}: the run would take no gradient step; lower --learning-starts")
    _hindsight_reward(args, settings, env)
    _check_model(args, args.frame_stack, env.observation_space, int(env.action_space.n), resuming=resuming)
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

    from .report import Report

    run_dir = Path(args.run_dir)
    agent = _agent(keras, args, settings, store, saved)
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
    write_checkpoint = _checkpointer(agent, run_dir, report)
    source = envs = None
    with stop_signals() as stop:
        try:
            if saved is None:
                write_checkpoint()  # as soon as the networks exist: --resume needs one
            if args.actors:
                from .actorplan import plan_for
                from .actors import ActorSource

                plan = plan_for(agent, args.actors, args.num_envs, args.total_timesteps, env_id=args.env_id,
                                env_kwargs=arguments.env_kwargs(args), actor_restarts=args.actor_restarts,
                                imports=(args.model.partition(":")[0],) if args.model else (),
                                ray_address=args.ray_address, lease_wait=lease_wait(args),
                                storage_options=arguments.store_options(args).get("storage_options"))
                source = ActorSource(plan, store, agent.learner, start, report.print)
            elif args.num_envs > 1:
                envs = make_vector_env(args.env_id, args.num_envs, halves=_overlap(args, keras),
                                       kwargs=arguments.env_kwargs(args))
            with evaluation_env(args, vector=args.num_envs > 1) as eval_env:
                agent.fit(envs if envs is not None else env, args.total_timesteps, eval_env=eval_env,
                          eval_frequency=args.eval_frequency if args.eval_episodes else 0,
                          eval_episodes=max(1, args.eval_episodes), eval_epsilon=args.eval_epsilon,
                          callbacks=[report, *_best(args, run_dir, report)],
                          checkpoint_frequency=args.checkpoint_frequency, checkpoint_writer=write_checkpoint,
                          should_stop=lambda: bool(stop), source=source, eval_seed=args.seed + 100_000)
        finally:
            report.close()
            if envs is not None:
                envs.close()
    step = agent.state.global_step
    if stop:
        return _stopped(stop[0], f"step {step:,}", "checkpoint saved and store flushed", run_dir)
    print(f"done: {step:,} steps, {agent.train_steps:,} gradient steps; store {arguments.store_path(args)} holds "
          f"{agent.state.stored:,} transitions; peak RSS {peak_rss_mb():,.0f} MB")
    return 0


def train_offline(args: Args, *, resuming: bool) -> int:
    """``--offline STORE``: learn from an existing store, read-only, for ``--gradient-steps`` (offline.py),
    with the run directory, checkpoints, signals, evaluations and reports of an online run."""
    run_dir = Path(args.run_dir)
    saved = _saved(run_dir) if resuming else None
    store = open_to_read(args.offline, cache_bytes=args.cache_mb * 2**20, options={})
    try:
        arguments.fill_presets(args, store.observation_space)
        settings = arguments.config(args)
        with evaluation_env(args, vector=True) as eval_env, _goal_env(args, eval_env) as goal_env:
            # (an unusable --env-id fails here, before anything is written)
            spaces = None if eval_env is None else env_spaces(eval_env)
            check_dataset(store, settings.batch_size, settings.n_step, spaces)
            reward = _hindsight_reward(args, settings, goal_env, store)
            if resuming:
                arguments.save(args, run_dir)  # the flags given now hold for a later plain --resume too
            else:
                _check_model(args, store.frame_stack, store.observation_space, int(store.action_space.n),
                             resuming=False)
                with new_run_dir(args):
                    pass  # (nothing to make in it but args.json: the store stays where it is)
            return _fit_offline(args, settings, store, eval_env, saved, reward)
    finally:
        store.close()


def _fit_offline(args: Args, settings: Any, store: ReplayStore, eval_env: Any, saved: Any,
                 reward: Callable[..., Any] | None) -> int:
    keras = import_keras()

    from .report import Report

    run_dir = Path(args.run_dir)
    agent = _agent(keras, args, settings, store, saved)
    if saved is not None:
        agent.restore(*saved)
    start = agent.train_steps
    if saved is not None:
        print(f"resuming {run_dir} at gradient step {start:,} ({len(store):,} transitions in {args.offline})")
        if start >= args.gradient_steps:
            print(f"nothing to do: the run already took its {start:,} gradient steps (--gradient-steps "
                  f"{args.gradient_steps:,}); to train on, resume with a larger --gradient-steps")
            return 0
    store.warm_cache()
    report = Report(run_dir, total=args.gradient_steps, start=start, progress=args.progress, offline=True)
    write_checkpoint = _checkpointer(agent, run_dir, report)
    with stop_signals() as stop:
        try:
            if saved is None:
                write_checkpoint()
            agent.fit_offline(args.gradient_steps, eval_env=eval_env,
                              eval_frequency=args.eval_frequency if args.eval_episodes else 0,
                              eval_episodes=max(1, args.eval_episodes), eval_epsilon=args.eval_epsilon,
                              eval_seed=args.seed + 100_000, callbacks=[report, *_best(args, run_dir, report)],
                              compute_reward=reward,
                              checkpoint_frequency=args.checkpoint_frequency, checkpoint_writer=write_checkpoint,
                              should_stop=lambda: bool(stop))
        finally:
            report.close()
    step = agent.train_steps
    if stop:
        return _stopped(stop[0], f"gradient step {step:,}", "checkpoint saved", run_dir)
    print(f"done: {step:,} gradient steps on {args.offline} ({len(store):,} transitions, read-only); "
          f"peak RSS {peak_rss_mb():,.0f} MB")
    return 0


def _saved(run_dir: Path) -> Any:
    """The checkpoint a run resumes from (None when it died before writing one)."""
    checkpoint.remove_partials(run_dir)
    return checkpoint.load(run_dir)


def _agent(keras: Any, args: Args, settings: Any, store: ReplayStore, saved: Any) -> Any:
    """The run's DQN: the default Q-network for the store's stacks and actions, Adam at --learning-rate;
    a new run with --init-from starts from that run's weights."""
    from .agent import DQN
    from .learnerbase import MAX_GRAD_NORM

    model = _model(keras, args, store.frame_stack, store.observation_space, int(store.action_space.n))
    target = _pretrained(args, model) if saved is None else None
    optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate, global_clipnorm=MAX_GRAD_NORM)
    agent = DQN(model, store, optimizer=optimizer, **dataclasses.asdict(settings))
    if target is not None:  # the model held the online weights when the learner was made; the target now
        learner = agent.learner
        assert learner is not None  # (built with the store)
        learner.load_state({**learner.state(), "target": target})
    return agent


def _best(args: Args, run_dir: Path, report: Any) -> list[Any]:
    """With evaluations: the callback that keeps the best evaluation's weights (``best.npz``)."""
    from .callbacks import BestWeights

    return [BestWeights(run_dir, say=report.print, best=checkpoint.load_best(run_dir))] if args.eval_episodes else []


def _model(keras: Any, args: Args, frame_stack: int, space: Any, actions: int) -> Any:
    """The run's Q-network: --model's, else the default one for the observation space."""
    keras.utils.set_random_seed(args.seed)
    return arguments.q_network(args, space, frame_stack, actions)


def _pretrained(args: Args, model: Any) -> list[Any] | None:
    """--init-from: the earlier run's online weights put into ``model``, and its target weights
    returned (its optimizer and counters are not taken); None without the flag. TrainerError when
    there is no checkpoint there or its weights do not fit the model."""
    if not args.init_from:
        return None
    where = Path(args.init_from)
    try:
        saved = checkpoint.load(where) if where.is_dir() else None
    except TrainerError as exc:
        raise TrainerError(f"--init-from {where}: {str(exc).removeprefix('cannot resume: ')}") from None
    if saved is None:
        raise TrainerError(f"--init-from {where} holds no {checkpoint.CHECKPOINT}; give the run directory of an "
                           "earlier replaystore-train run (online or --offline), or a directory DQN.save wrote")
    try:
        model.set_weights(saved[0]["online"])
    except ValueError as exc:
        raise TrainerError(f"--init-from {where}: its weights do not fit this run's Q-network ({exc}); start from "
                           "a run on the same frames, frame stack, actions and --hidden-sizes") from None
    return list(saved[0]["target"])


def _check_model(args: Args, frame_stack: int, space: Any, actions: int, *, resuming: bool) -> None:
    """Refuse an unusable --model, and a new run's unusable --init-from, before the run's directory
    is made or its store touched (this loads Keras early)."""
    if not args.model and (resuming or not args.init_from):
        return
    from .models import check_model
    from .stacks import StackSpec

    model = _model(import_keras(), args, frame_stack, space, actions)
    check_model(model, StackSpec.of_space(space, frame_stack), actions)
    if not resuming:
        _pretrained(args, model)


def _checkpointer(agent: Any, run_dir: Path, report: Any) -> Callable[[], None]:
    """What writes the run's checkpoint (and flushes its TensorBoard log with it)."""

    def write() -> None:
        arrays, state = agent.checkpoint_arrays()
        checkpoint.save(run_dir, arrays, state)
        report.writer.flush()

    return write


@contextlib.contextmanager
def _goal_env(args: Args, eval_env: Any) -> Iterator[Any]:
    """The env whose ``compute_reward`` relabels an --offline run's goals (--her-n-sampled-goal): the
    evaluation env, else one made for it (closed after the block); None without relabelling."""
    if not args.her_n_sampled_goal or eval_env is not None:
        yield eval_env
        return
    env = make_env(args.env_id, arguments.env_kwargs(args))
    try:
        yield env
    finally:
        env.close()


def _hindsight_reward(args: Args, settings: Any, env: Any,
                      store: ReplayStore | None = None) -> Callable[..., Any] | None:
    """With --her-n-sampled-goal: the env's ``compute_reward``, once the env (and ``store``, offline)
    are known to be a goal env's, before anything is written; TrainerError naming the flag where not.
    None without relabelling."""
    if not settings.her_n_sampled_goal:
        return None
    from .hindsight import check_goals, hindsight_sampler, reward_function
    from .stacks import StackSpec

    space = store.observation_space if store is not None else env_spaces(env)[0]
    check_goals(StackSpec.of_space(space, store.frame_stack if store is not None else args.frame_stack), FLAGS)
    reward = reward_function(env)
    if reward is None:
        raise TrainerError(f"--her-n-sampled-goal is {args.her_n_sampled_goal}, but {args.env_id} has no "
                           "compute_reward(achieved_goal, desired_goal, info) to give relabelled transitions their "
                           "reward: give a goal env's id (gymnasium-robotics' GoalEnv API), or --her-n-sampled-goal 0")
    if store is not None:
        hindsight_sampler(settings, store, reward)  # (a store it cannot relabel is refused here)
    return reward


def _stopped(signum: int, where: str, kept: str, run_dir: Path) -> int:
    print(f"stopped by {signal.Signals(signum).name} at {where}: {kept}; continue with: replaystore-train --resume "
          f"{run_dir}")
    return 128 + signum


def _overlap(args: Args, keras: Any) -> bool:
    """Whether to step the envs as two halves in turn (--overlap-envs): on, off, or auto: where Keras
    computes on a GPU (there a forward pass is shorter than half the envs' step, and hides behind it;
    on a CPU it is not, and two forward passes per step cost more than they hide)."""
    if args.overlap_envs != "auto":
        return args.overlap_envs == "on"
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() not in ("cpu", "tpu")
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if backend == "torch":
        import torch

        return bool(torch.cuda.is_available())
    return False


if __name__ == "__main__":
    sys.exit(main())
