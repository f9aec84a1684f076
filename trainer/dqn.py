"""``replaystore-train``: DQN (Mnih et al. 2015, with double-DQN targets) whose replay buffer is a
replaystore on disk. Reads top to bottom like cleanrl's dqn_atari.py: Args -> env -> Q-network -> loop.

The loop acts epsilon-greedily on frame stacks built like the store's and adds every transition to
the store (one env here, ``--num-envs`` through acting.py, or Ray actor processes through
actors.py). From ``learning_starts`` on the learner (learn.py) takes one gradient step per
``train_frequency`` env steps on batches the store sampled ahead in the background: on its own
thread held to the replay ratio (the default), or inside the loop (``--replay-ratio 0``).

Run directory (``--run-dir``)::

    args.json        the arguments (``--resume`` reads them back)
    replay.zarr/     the replay store: the replay half of the checkpoint, reopened in place on resume
    checkpoint.npz   weights, optimizer state, step, episode counters, RNG states (replaced atomically)
    tb/              TensorBoard logs (see report.py for the tags)
    evals.jsonl      one line per evaluation (with --eval-episodes)

Stopping: SIGINT/SIGTERM finish the current step, flush the store, write a checkpoint and exit
(status 128 + signal). After a SIGKILL, ``--resume`` starts from the last checkpoint and keeps every
transition the store committed since; the environment cannot be restored, so the store's episode in
progress is closed as truncated and a new one starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from replaystore import ReplayStore, ReplayStoreError, StoreLockedError
from trainer import args as arguments
from trainer import checkpoint
from trainer.acting import VectorActing
from trainer.args import Args, TrainerError
from trainer.envs import FrameStacker, default_frame_stack, is_atari, life_lost, make_env

STORE = "replay.zarr"
EVALS = "evals.jsonl"
#: Steps between TensorBoard scalar writes (losses are averaged over them).
REPORT_STEPS = 1000


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    try:
        args, resuming = arguments.parse(argv)
        return train(args, resuming=resuming)
    except (TrainerError, ReplayStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / max(duration, 1.0)
    return max(slope * t + start_e, end_e)


def open_writing(args: Args, *, streams: Any, cache_bytes: int) -> ReplayStore:
    """Open the run's store (``streams`` of it) for writing. On object storage the streams of a
    process that died stay leased until the lease expires (``--lease-ttl``): wait for that."""
    deadline = time.monotonic() + (args.lease_ttl + 15 if args.store else 0)
    while True:
        try:
            return ReplayStore.open(arguments.store_path(args), mode="a", streams=streams, cache_bytes=cache_bytes,
                                    **arguments.store_options(args))
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def open_store(args: Args, env: Any, *, resuming: bool) -> ReplayStore:
    """Create the run directory and its store, or reopen them in place to resume."""
    run_dir = Path(args.run_dir)
    path = arguments.store_path(args)
    cache_bytes = args.cache_mb * 2**20
    if resuming:
        checkpoint.remove_partials(run_dir)
        if isinstance(path, Path) and not path.exists():
            raise TrainerError(f"cannot resume: {run_dir} has no {STORE}; it holds no run")
        store = open_writing(args, streams=None, cache_bytes=cache_bytes)
        if (store.observation_space.shape != env.observation_space.shape or store.frame_stack != args.frame_stack
                or store.action_space.n != env.action_space.n):
            store.close()
            raise TrainerError(f"{path} stores {store.observation_space} x{store.frame_stack} with "
                               f"{store.action_space}, which does not match {args.env_id}; it was not written by this run")
        return store
    if run_dir.exists() and any(run_dir.iterdir()):
        raise TrainerError(f"{run_dir} already holds files; continue that run with --resume {run_dir}, "
                           "or pick a new --run-dir")
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        store = ReplayStore.create(path, args.buffer_size, env.observation_space, env.action_space, args.frame_stack,
                                   cache_bytes=cache_bytes, num_streams=arguments.num_streams(args),
                                   **arguments.store_options(args))
    except BaseException:
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    arguments.save(args, run_dir)
    return store


def train(args: Args, *, resuming: bool) -> int:
    env = make_env(args.env_id)  # an unusable id fails here, before anything is written
    if not args.frame_stack:
        args.frame_stack = default_frame_stack(env.observation_space)
    run_dir = Path(args.run_dir)
    saved = checkpoint.load(run_dir) if resuming else None
    store = open_store(args, env, resuming=resuming)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter (no GPU, CPU flags)
    import keras  # TensorFlow loads here, once the arguments and the run directory are known to be good

    from trainer.learn import Learning
    from trainer.report import Report

    keras.utils.set_random_seed(args.seed)
    agent = make_agent(args, env, keras.backend.backend())
    rng = np.random.default_rng(args.seed)
    state: dict[str, Any] = {"global_step": 0, "episodes": 0, "resumes": 0, "epsilon": args.start_e}
    if saved is not None:
        arrays, state = saved
        agent.load_state(arrays)
        rng.bit_generator.state = state["rng"]
        state["resumes"] += 1
    ended = store.end_episode() if resuming else False
    if args.actors:  # the actor processes write the streams; this one learns from them, read-only
        store.close()
        store = ReplayStore.open(arguments.store_path(args), cache_bytes=args.cache_mb * 2**20,
                                 **arguments.store_options(args))
    if resuming:
        store.warm_cache()  # the compressed chunks, up to --cache-mb: ~65 MB and ~1 s for 1M Atari frames
    start = int(state["global_step"])
    report = Report(run_dir, total=args.total_timesteps, start=start, progress=args.progress)
    if resuming:
        report.print(f"resuming {run_dir} at step {start:,} (epsilon {state['epsilon']:.3f}, {agent.train_steps:,} "
                     f"gradient steps, {len(store):,} transitions in the store"
                     f"{'; closed its unfinished episode' if ended else ''})")

    stop: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _: stop.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    learning = Learning(args, store, agent, report, state)  # its sampling starts once learning starts
    global_step = start
    try:
        if saved is None:
            save_checkpoint(run_dir, store, agent, rng, state, report)
        if arguments.replay_ratio(args) > 0:
            learning.start_thread(start)
        if args.actors:
            from trainer.actors import run_actor_loop as loop
        else:
            loop = run_loop if args.num_envs == 1 else run_vector_loop
        global_step = loop(args, env, store, agent, rng, state, report, stop, learning)
        state["global_step"] = global_step
        learning.close()
        save_checkpoint(run_dir, store, agent, rng, state, report)
        if not stop and args.eval_episodes and state.get("evaluated_at") != global_step:
            record_eval(args, agent, global_step, report)
    finally:
        learning.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        report.close()
        store.close()
        env.close()
    peak = peak_rss_mb()
    if stop:
        name = signal.Signals(stop[0]).name
        print(f"stopped by {name} at step {global_step:,}: checkpoint saved and store flushed; "
              f"continue with: replaystore-train --resume {run_dir}")
        return 128 + stop[0]
    print(f"done: {global_step:,} steps, {agent.train_steps:,} gradient steps; store {arguments.store_path(args)} holds "
          f"{state['stored']:,} transitions; peak RSS {peak:,.0f} MB")
    return 0


def run_loop(args: Args, env: Any, store: ReplayStore, agent: Any, rng: np.random.Generator, state: dict[str, Any],
             report: Any, stop: list[int], learning: Any) -> int:
    """Act, store, learn, report and checkpoint from ``state['global_step']`` to ``total_timesteps``."""
    atari = is_atari(args.env_id)
    clip = atari and args.clip_reward
    stacker = FrameStacker(args.frame_stack, env.observation_space.shape, env.observation_space.dtype)
    obs, info = env.reset(seed=args.seed + 7919 * int(state["resumes"]))
    env.action_space.seed(args.seed + int(state["resumes"]))
    stacker.reset(obs)
    _, lives = life_lost(info, None)
    duration = args.exploration_fraction * args.total_timesteps
    global_step = int(state["global_step"])
    while global_step < args.total_timesteps and not stop:
        epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
        if rng.random() < epsilon:
            action = int(rng.integers(env.action_space.n))
        else:
            action = agent.act(stacker.stack)
        next_obs, reward, terminated, truncated, info = env.step(action)
        lost, lives = life_lost(info, lives)
        end_for_learning = bool(terminated) or (atari and args.terminal_on_life_loss and lost)
        store.add(obs, action, float(np.sign(reward)) if clip else float(reward), next_obs, end_for_learning,
                  bool(truncated) and not end_for_learning)
        global_step += 1
        if terminated or truncated:
            state["episodes"] += 1
            report.episode(global_step, float(info["episode"]["r"]), int(info["episode"]["l"]))
            obs, info = env.reset()
            _, lives = life_lost(info, None)
            stacker.reset(obs)
        elif end_for_learning:
            obs = next_obs
            stacker.reset(obs)
        else:
            obs = next_obs
            stacker.push(obs)

        if learning.decoupled:
            learning.acted(1)
        elif global_step > args.learning_starts and global_step % args.train_frequency == 0:
            if not learning.started and len(store) >= args.batch_size + args.n_step:
                learning.start(global_step)
            learning.steps(1)

        state["epsilon"] = epsilon
        on_schedule(args, store, agent, rng, state, report, learning, global_step - 1, global_step)
    if global_step % REPORT_STEPS:
        report.periodic(global_step, epsilon=state["epsilon"], replay_size=len(store), cache_hit_rate=store.cache_hit_rate)
    state["stored"] = len(store)
    return global_step


def run_vector_loop(args: Args, env: Any, store: ReplayStore, agent: Any, rng: np.random.Generator,
                    state: dict[str, Any], report: Any, stop: list[int], learning: Any) -> int:
    """``run_loop`` with ``--num-envs`` environments stepped together (``make_vector_env``): one
    forward pass picks every env's action, ``store.add_batch`` writes each env's move to its own
    stream, and the learner takes one gradient step per ``train_frequency`` env steps (so the replay
    ratio is the single env's). The vector env resets an ended env on its next step (next-step
    autoreset): that row is no env step, and the store skips it."""
    acting = VectorActing(args, store, args.num_envs, int(env.action_space.n),
                          seed=args.seed + 7919 * int(state["resumes"]))
    try:
        duration = args.exploration_fraction * args.total_timesteps
        global_step = int(state["global_step"])
        epsilon = state["epsilon"]
        while global_step < args.total_timesteps and not stop:
            epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
            moved, ended = acting.step(agent.act_batch, epsilon, rng)
            before = global_step
            global_step += moved
            for ep_return, ep_length in ended:
                state["episodes"] += 1
                report.episode(global_step, ep_return, ep_length)

            if learning.decoupled:
                learning.acted(global_step - before)
            elif global_step > args.learning_starts:
                steps = global_step // args.train_frequency - max(before, args.learning_starts) // args.train_frequency
                if not learning.started and steps and len(store) >= args.batch_size + args.n_step:
                    learning.start(global_step)
                learning.steps(steps)
            state["epsilon"] = epsilon
            on_schedule(args, store, agent, rng, state, report, learning, before, global_step)
    finally:
        acting.close()
    report.periodic(global_step, epsilon=state["epsilon"], replay_size=len(store), cache_hit_rate=store.cache_hit_rate)
    state["stored"] = len(store)
    return global_step


def make_agent(args: Args, env: Any, backend: str) -> Any:
    """The DQN agent for the backend Keras runs on (``KERAS_BACKEND``): agent.py (TensorFlow) or
    agent_jax.py (JAX); the same networks, loss, optimizer and checkpoint arrays."""
    stack_shape = (args.frame_stack, *env.observation_space.shape)
    kwargs = {"learning_rate": args.learning_rate, "hidden_sizes": arguments.hidden_sizes(args),
              "target_every": args.target_network_frequency // args.train_frequency, "tau": args.tau}
    if backend == "jax":
        from trainer.agent_jax import JaxAgent

        return JaxAgent(stack_shape, env.observation_space.dtype, int(env.action_space.n), **kwargs)
    if backend != "tensorflow":
        raise TrainerError(f"KERAS_BACKEND is {backend!r}; the trainer runs on 'tensorflow' (the default) or 'jax'")
    from trainer.agent import Agent

    return Agent(stack_shape, env.observation_space.dtype, int(env.action_space.n), **kwargs)


def on_schedule(args: Args, store: ReplayStore, agent: Any, rng: np.random.Generator, state: dict[str, Any],
                report: Any, learning: Any, before: int, global_step: int) -> None:
    """What is due once the run moved from env step ``before`` to ``global_step``: TensorBoard
    scalars, the progress bar, a checkpoint (the learner paused) and an evaluation."""
    epsilon = state["epsilon"]
    if crossed(before, global_step, REPORT_STEPS):
        report.periodic(global_step, epsilon=epsilon, replay_size=len(store), cache_hit_rate=store.cache_hit_rate,
                        extra=learning.metrics())
    if crossed(before, global_step, 100):
        report.tick(global_step, epsilon=epsilon, replay_size=len(store))
    if crossed(before, global_step, args.checkpoint_frequency):
        state["global_step"] = global_step
        with learning.paused():
            save_checkpoint(Path(args.run_dir), store, agent, rng, state, report)
    if args.eval_episodes and args.eval_frequency and crossed(before, global_step, args.eval_frequency):
        record_eval(args, agent, global_step, report)
        state["evaluated_at"] = global_step


def crossed(before: int, now: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, now]``."""
    return now // every > before // every


def save_checkpoint(run_dir: Path, store: ReplayStore, agent: Any, rng: np.random.Generator, state: dict[str, Any],
                    report: Any) -> None:
    """Flush the store first, so the checkpoint never runs ahead of the replay data it trained on
    (with ``--actors`` the actors commit their own streams and this process only reads)."""
    if store.writing:
        store.flush()
    state["rng"] = rng.bit_generator.state
    state["train_steps"] = agent.train_steps
    state["stored"] = len(store)
    checkpoint.save(run_dir, agent.state(), state)
    report.flush()


def evaluate(agent: Any, args: Args, episodes: int, *, seed: int) -> list[float]:
    """Returns of ``episodes`` full episodes played with ``eval_epsilon``-greedy actions."""
    env = make_env(args.env_id)
    rng = np.random.default_rng(seed)
    stacker = FrameStacker(args.frame_stack, env.observation_space.shape, env.observation_space.dtype)
    returns = []
    try:
        for i in range(episodes):
            obs, info = env.reset(seed=seed + i)
            _, lives = life_lost(info, None)
            stacker.reset(obs)
            while True:
                if rng.random() < args.eval_epsilon:
                    action = int(rng.integers(env.action_space.n))
                else:
                    action = agent.act(stacker.stack)
                obs, _, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    returns.append(float(info["episode"]["r"]))
                    break
                lost, lives = life_lost(info, lives)
                if lost and is_atari(args.env_id) and args.terminal_on_life_loss:
                    stacker.reset(obs)  # the agent learned on stacks that restart at a lost life
                else:
                    stacker.push(obs)
    finally:
        env.close()
    return returns


def record_eval(args: Args, agent: Any, step: int, report: Any) -> None:
    t0 = time.time()
    returns = evaluate(agent, args, args.eval_episodes, seed=args.seed + 100_000)
    mean = float(np.mean(returns))
    report.scalars(step, {"eval/mean_return": mean})
    record = {"step": step, "mean_return": mean, "returns": returns, "time": time.time(), "eval_s": time.time() - t0}
    with open(Path(args.run_dir) / EVALS, "a") as f:
        f.write(json.dumps(record) + "\n")
    report.print(f"eval at step {step:,}: mean return {mean:.1f} over {len(returns)} episodes")


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
