"""The trainer's hyperparameters: one ``Args`` dataclass (cleanrl's names), its command line, and the
rules for ``--resume`` (the run's saved ``args.json`` wins; only a few flags may change).

Defaults are for a real Atari run on a GPU machine (cleanrl's dqn_atari.py: 10M steps, a 1M buffer,
learning from step 80k). Short CPU runs pass smaller numbers; CartPole settings are in
tools/learning_curve.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any


class TrainerError(Exception):
    """A bad argument or run directory; the CLI prints ``error: <message>`` and exits 1."""


@dataclasses.dataclass
class Args:
    env_id: str = dataclasses.field(default="ALE/Breakout-v5", metadata={"help": "gymnasium id with a Discrete action space"})
    total_timesteps: int = dataclasses.field(default=10_000_000, metadata={"help": "environment steps of the whole run"})
    run_dir: str = dataclasses.field(default="", metadata={"help": "where the store, checkpoint, logs and args go (default runs/<env>-<seed>)"})
    store: str = dataclasses.field(default="", metadata={"help": "put the replay store at this URL (s3://bucket/prefix/replay.zarr; endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) instead of RUN_DIR/replay.zarr"})
    lease_ttl: float = dataclasses.field(default=30.0, metadata={"help": "with --store URL: seconds a writer's lease on its streams lasts unrenewed; a crashed writer's streams are taken over after that"})
    seed: int = dataclasses.field(default=1, metadata={"help": "seeds the network, the environment and exploration"})
    learning_rate: float = dataclasses.field(default=1e-4, metadata={"help": "Adam's learning rate"})
    buffer_size: int = dataclasses.field(default=1_000_000, metadata={"help": "replay store capacity in steps (on disk)"})
    num_envs: int = dataclasses.field(default=1, metadata={"help": "environments stepped together, each writing its own stream of the store (ALE ids: ale-py's AtariVectorEnv)"})
    gamma: float = dataclasses.field(default=0.99, metadata={"help": "discount factor"})
    tau: float = dataclasses.field(default=1.0, metadata={"help": "target update rate (1.0 = hard copy)"})
    target_network_frequency: int = dataclasses.field(default=1000, metadata={"help": "steps between target updates"})
    batch_size: int = dataclasses.field(default=32, metadata={"help": "transitions per gradient step"})
    start_e: float = dataclasses.field(default=1.0, metadata={"help": "epsilon at the start"})
    end_e: float = dataclasses.field(default=0.01, metadata={"help": "epsilon after the schedule"})
    exploration_fraction: float = dataclasses.field(default=0.10, metadata={"help": "fraction of total_timesteps over which epsilon falls"})
    learning_starts: int = dataclasses.field(default=80_000, metadata={"help": "steps of acting before learning"})
    train_frequency: int = dataclasses.field(default=4, metadata={"help": "steps between gradient steps"})
    n_step: int = dataclasses.field(default=1, metadata={"help": "n-step returns (sampled by the store)"})
    prioritized: bool = dataclasses.field(default=False, metadata={"help": "prioritized replay (proportional)"})
    alpha: float = dataclasses.field(default=0.6, metadata={"help": "priority exponent (with --prioritized)"})
    beta: float = dataclasses.field(default=0.4, metadata={"help": "importance-weight exponent (with --prioritized)"})
    hidden_sizes: str = dataclasses.field(default="120,84", metadata={"help": "MLP layer widths for vector observations"})
    frame_stack: int = dataclasses.field(default=0, metadata={"help": "frames per observation (0: 4 for images, 1 for vectors)"})
    terminal_on_life_loss: bool = dataclasses.field(default=True, metadata={"help": "Atari: a lost life ends the episode for learning"})
    clip_reward: bool = dataclasses.field(default=True, metadata={"help": "Atari: learn from sign(reward)"})
    checkpoint_frequency: int = dataclasses.field(default=100_000, metadata={"help": "steps between checkpoints"})
    eval_frequency: int = dataclasses.field(default=0, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_episodes: int = dataclasses.field(default=0, metadata={"help": "episodes per evaluation (0: no evaluation)"})
    eval_epsilon: float = dataclasses.field(default=0.0, metadata={"help": "epsilon while evaluating"})
    cache_mb: int = dataclasses.field(default=256, metadata={"help": "the store's compressed-chunk cache in MiB"})
    sample_threads: int = dataclasses.field(default=2, metadata={"help": "threads that sample batches ahead of the learner"})
    replay_ratio: str = dataclasses.field(default="auto", metadata={
        "help": "sampled per inserted transitions, held by running the learner on its own thread beside acting; "
                "auto: batch-size / train-frequency (8 with the defaults: the data reuse of lockstep DQN); "
                "0: lockstep (acting stops for a gradient step every --train-frequency env steps)"})
    steps_per_call: int = dataclasses.field(default=0, metadata={
        "help": "gradient steps per compiled call, on one block of that many batches (0: the backend's default, "
                "8 on TensorFlow, 32 on JAX)"})
    actors: int = dataclasses.field(default=0, metadata={
        "help": "Ray actor processes that act, each stepping --num-envs envs into its own streams of the store, "
                "while this process learns (0: act in this process)"})
    actor_restarts: int = dataclasses.field(default=3, metadata={
        "help": "with --actors: how many times one actor may die and be restarted on its streams before the run "
                "ends with its error"})
    ray_address: str = dataclasses.field(default="", metadata={
        "help": "with --actors: the address of a running Ray cluster to join (empty: start a local Ray)"})
    progress: bool = dataclasses.field(default=True, metadata={"help": "show a live progress bar"})


#: Flags that ``--resume`` accepts: how long to go on and how to report, not what is learned.
RESUMABLE = ("total_timesteps", "checkpoint_frequency", "eval_frequency", "eval_episodes", "progress", "sample_threads",
             "steps_per_call", "ray_address", "lease_ttl", "actor_restarts")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaystore-train",
        description="Train a DQN (Keras 3) on a gymnasium environment; the replay buffer is a replaystore on disk.",
        epilog="Resume a stopped or crashed run with: replaystore-train --resume RUN_DIR",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--resume", metavar="RUN_DIR", default=None,
                        help="continue the run in RUN_DIR (its saved arguments are used)")
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default,
                                help=field.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}[field.type if isinstance(field.type, str) else field.type.__name__]
            parser.add_argument(flag, type=kind, default=field.default, help=field.metadata["help"])
    return parser


def parse(argv: list[str] | None) -> tuple[Args, bool]:
    """Parse the command line into ``Args`` and whether it resumes a run (then ``args.json`` is loaded)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.resume is None:
        args = Args(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(Args)})
        if not args.run_dir:
            args.run_dir = str(Path("runs") / f"{args.env_id.replace('/', '_')}-{args.seed}")
        check(args)
        return args, False
    given = _explicit(parser, argv)
    changed = sorted(set(given) - set(RESUMABLE) - {"resume"})
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise TrainerError(f"{flags} cannot change when resuming; --resume takes the run's saved arguments and only "
                           f"{', '.join('--' + n.replace('_', '-') for n in RESUMABLE)}")
    args = load(Path(ns.resume))
    for name in given:
        if name != "resume":
            setattr(args, name, getattr(ns, name))
    args.run_dir = ns.resume
    check(args)
    return args, True


def _explicit(parser: argparse.ArgumentParser, argv: list[str] | None) -> list[str]:
    """The destinations given on the command line (not defaulted)."""
    quiet = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            kwargs: dict[str, Any] = {"dest": action.dest}
            if isinstance(action, argparse.BooleanOptionalAction):
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = action.type
            quiet.add_argument(*action.option_strings, **kwargs)
    return list(vars(quiet.parse_known_args(argv)[0]))


def check(args: Args) -> None:
    """Refuse values no run can use, naming the flag and its range."""
    positive = ("total_timesteps", "buffer_size", "batch_size", "train_frequency", "target_network_frequency",
                "n_step", "checkpoint_frequency", "cache_mb", "sample_threads")
    for name in positive:
        if getattr(args, name) < (0 if name == "cache_mb" else 1):
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be a positive integer")
    replay_ratio(args)
    for name in ("learning_starts", "eval_frequency", "eval_episodes", "frame_stack", "steps_per_call"):
        if getattr(args, name) < 0:
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 0")
    for name in ("gamma", "tau", "start_e", "end_e", "exploration_fraction", "alpha", "beta", "eval_epsilon"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be in [0, 1]")
    if not args.learning_rate > 0:
        raise TrainerError(f"--learning-rate is {args.learning_rate}; it must be > 0")
    if args.buffer_size < max(args.batch_size, 2):
        raise TrainerError(f"--buffer-size {args.buffer_size} is smaller than --batch-size {args.batch_size}; "
                           "the replay store must hold at least one batch (DQN usually keeps 10^5-10^6 steps)")
    if not 1 <= args.num_envs <= 1024:
        raise TrainerError(f"--num-envs is {args.num_envs}; it must be between 1 and 1024")
    if not 0 <= args.actors <= 256:
        raise TrainerError(f"--actors is {args.actors}; it must be between 0 and 256")
    if not 0 <= args.actor_restarts <= 1000:
        raise TrainerError(f"--actor-restarts is {args.actor_restarts}; it must be between 0 and 1000")
    if args.actors and replay_ratio(args) <= 0:
        raise TrainerError("--actors needs the decoupled learner: give --replay-ratio auto or a number > 0, not 0")
    streams = num_streams(args)
    if args.buffer_size % streams:
        lower = args.buffer_size - args.buffer_size % streams
        over = f"--num-envs {args.num_envs}" + (f" x --actors {args.actors}" if args.actors else "")
        raise TrainerError(f"--buffer-size {args.buffer_size} does not split evenly over {over} "
                           f"(each env writes its own stream); use {lower} or {lower + streams}")
    if args.n_step >= args.buffer_size // streams:
        raise TrainerError(f"--n-step {args.n_step} must be smaller than --buffer-size {args.buffer_size}")
    hidden_sizes(args)


def num_streams(args: Args) -> int:
    """The store's streams: one per env, of every actor process."""
    return args.num_envs * max(1, args.actors)


def replay_ratio(args: Args) -> float:
    """``--replay-ratio`` as a number: ``auto`` is batch-size / train-frequency; 0 means lockstep."""
    value = args.replay_ratio
    if value == "auto":
        return args.batch_size / args.train_frequency
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        ratio = float("nan")
    if not ratio >= 0 or ratio == float("inf"):
        raise TrainerError(f"--replay-ratio is {value!r}; give a number >= 0 (sampled per inserted transition; "
                           "0 for lockstep) or auto")
    return ratio


def hidden_sizes(args: Args) -> list[int]:
    try:
        sizes = [int(s) for s in args.hidden_sizes.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise TrainerError(f"--hidden-sizes is {args.hidden_sizes!r}; give layer widths like 120,84")
    return sizes


ARGS_FILE = "args.json"


def store_path(args: Args) -> str | Path:
    """Where the run's replay store is: ``--store`` (a URL), else RUN_DIR/replay.zarr."""
    return args.store or Path(args.run_dir) / "replay.zarr"


def store_options(args: Args) -> dict[str, Any]:
    """``ReplayStore.open``/``create`` keywords for the run's store (the lease of a store at a URL)."""
    return {"storage_options": {"lease_ttl": args.lease_ttl}} if args.store else {}


def save(args: Args, run_dir: Path) -> None:
    (run_dir / ARGS_FILE).write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")


def load(run_dir: Path) -> Args:
    path = run_dir / ARGS_FILE
    if not run_dir.is_dir():
        raise TrainerError(f"cannot resume: {run_dir} does not exist; pass the --run-dir of an earlier run")
    if not path.is_file():
        raise TrainerError(f"cannot resume: {run_dir} holds no run ({ARGS_FILE} is missing); "
                           "start a new run with --run-dir instead")
    try:
        saved = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(Args)}
        return Args(**{k: v for k, v in saved.items() if k in known})
    except (ValueError, TypeError) as exc:
        raise TrainerError(f"cannot resume: {path} is not a valid arguments file ({exc})") from exc
