"""The command line's flags: one ``Args`` dataclass (cleanrl's names), its parser, and the rules for
``--resume`` (the run's saved ``args.json`` wins; only a few flags may change, and those given are
recorded in it, so a later plain ``--resume`` goes on with them).

The hyperparameters among the flags are ``DQNConfig``'s (config.py); ``config(args)`` makes one.
Defaults are for a real Atari run on a GPU machine (cleanrl's dqn_atari.py: 10M steps, a 1M buffer,
learning from step 80k). Short CPU runs pass smaller numbers; CartPole settings are in
tools/learning_curve.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import DQNConfig, TrainerError
from .envs import atari_settings, is_atari


@dataclasses.dataclass
class Args:
    env_id: str = dataclasses.field(default="ALE/Breakout-v5", metadata={"help": "gymnasium id with a Discrete action space"})
    env_kwargs: str = dataclasses.field(default="", metadata={"help": "keywords for gym.make, as a JSON object, such as '{\"is_slippery\": false}'; ALE ids take repeat_action_probability (sticky actions; 0.25), full_action_space (false), max_num_frames_per_episode (108000), noop_max (30), frameskip (4)"})
    total_timesteps: int = dataclasses.field(default=10_000_000, metadata={"help": "environment steps of the whole run"})
    run_dir: str = dataclasses.field(default="", metadata={"help": "where the store, checkpoint, logs and args go (default runs/<env>-<seed>)"})
    store: str = dataclasses.field(default="", metadata={"help": "put the replay store at this URL (s3://bucket/prefix/replay.zarr; endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) instead of RUN_DIR/replay.zarr"})
    offline: str = dataclasses.field(default="", metadata={"help": "learn offline from this existing replay store (a path or URL), read-only: gradient steps on its transitions, acting nowhere; the env is only for --eval-episodes (docs/trainer.md)"})
    gradient_steps: int = dataclasses.field(default=100_000, metadata={"help": "with --offline: gradient steps of the whole run"})
    init_from: str = dataclasses.field(default="", metadata={"help": "start a new run from the online and target weights of an earlier one (its RUN_DIR, online or --offline, or a directory DQN.save wrote), with a fresh optimizer and counters: pretrain with --offline, then fine-tune online"})
    lease_ttl: float = dataclasses.field(default=30.0, metadata={"help": "with --store URL: seconds a writer's lease on its streams lasts unrenewed; a crashed writer's streams are taken over after that"})
    seed: int = dataclasses.field(default=1, metadata={"help": "seeds the network, the environment and exploration"})
    learning_rate: float = dataclasses.field(default=1e-4, metadata={"help": "Adam's learning rate"})
    buffer_size: int = dataclasses.field(default=1_000_000, metadata={"help": "replay store capacity in steps (on disk)"})
    num_envs: int = dataclasses.field(default=1, metadata={"help": "environments stepped together, each writing its own stream of the store (ALE ids: ale-py's AtariVectorEnv)"})
    overlap_envs: str = dataclasses.field(default="auto", metadata={"help": "ALE ids with --num-envs >= 2: on steps the envs as two halves in turn, one half's envs stepping while the other half's moves are written and its next actions picked (the forward pass); off steps them all at once; auto is on where Keras computes on a GPU"})
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
    cql_alpha: float = dataclasses.field(default=0.0, metadata={"help": "conservative Q-learning's weight (1.0 is usual with --offline); 0: plain DQN"})
    info_keys: str = dataclasses.field(default="", metadata={"help": "keep these keys of the env's infos with each move, as the store's extras (replaystore episodes shows them at each episode's end, inspect their statistics): NAME[:DTYPE],... such as is_success:bool,lives:int32 (DTYPE float32 unless given; a move whose info lacks a key keeps 0)"})
    her_n_sampled_goal: int = dataclasses.field(default=0, metadata={"help": "a goal env's Dict observations (achieved_goal, desired_goal): hindsight experience replay, this many transitions relabelled with a goal the episode reached for each real one (4 is HER's usual), their rewards from the env's compute_reward; 0: no relabelling"})
    her_strategy: str = dataclasses.field(default="future", metadata={"help": "with --her-n-sampled-goal: where a relabelled goal comes from: future (a later step of the episode), final or episode"})
    model: str = dataclasses.field(default="", metadata={"help": "your own Q-network: module:function, called as function(observation_space, n_actions, frame_stack) for a keras.Model from the store's stacks (batch, frame_stack, *frame) to one Q-value per action (the module is imported: put its folder on PYTHONPATH); default: nature_cnn for images, mlp for vectors (--hidden-sizes), embedded_mlp for a Discrete, dict_mlp for Dicts and Tuples"})
    hidden_sizes: str = dataclasses.field(default="120,84", metadata={"help": "MLP layer widths for vector, Dict and Tuple observations"})
    frame_stack: int = dataclasses.field(default=0, metadata={"help": "frames per observation (default: 4 for images, 1 for vectors)"})
    terminal_on_life_loss: bool = dataclasses.field(default=True, metadata={"help": "Atari: a lost life ends the episode for learning"})
    clip_reward: bool = dataclasses.field(default=True, metadata={"help": "Atari: learn from sign(reward)"})
    checkpoint_frequency: int = dataclasses.field(default=100_000, metadata={"help": "steps between checkpoints"})
    eval_frequency: int = dataclasses.field(default=0, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_episodes: int = dataclasses.field(default=0, metadata={"help": "episodes per evaluation (0: no evaluation); with --num-envs > 1 played side by side on up to 32 envs"})
    eval_epsilon: float = dataclasses.field(default=0.0, metadata={"help": "epsilon while evaluating"})
    cache_mb: int = dataclasses.field(default=256, metadata={"help": "the store's compressed-chunk cache in MiB"})
    sample_threads: int = dataclasses.field(default=2, metadata={"help": "threads that sample batches ahead of the learner"})
    replay_ratio: str = dataclasses.field(default="auto", metadata={
        "help": "sampled per inserted transitions, held by running the learner on its own thread beside acting; "
                "auto: batch-size / train-frequency (8 with the defaults: the data reuse of lockstep DQN); "
                "0: lockstep (acting stops for a gradient step every --train-frequency env steps)"})
    steps_per_call: int = dataclasses.field(default=0, metadata={
        "help": "gradient steps per compiled call, on one block of that many batches (default: the backend's, "
                "8 on TensorFlow and PyTorch, 32 on JAX)"})
    actors: int = dataclasses.field(default=0, metadata={
        "help": "Ray actor processes that act, each stepping --num-envs envs into its own streams of the store, "
                "while this process learns (0: act in this process)"})
    actor_restarts: int = dataclasses.field(default=3, metadata={
        "help": "with --actors: how many times one actor may die and be restarted on its streams before the run "
                "ends with its error"})
    ray_address: str = dataclasses.field(default="", metadata={
        "help": "with --actors: the address of a running Ray cluster to join (default: start a local Ray)"})
    progress: bool = dataclasses.field(default=True, metadata={"help": "show a live progress bar on a terminal (elsewhere, and with --no-progress: a log line every 30 s)"})


#: Flags that ``--resume`` accepts: how long to go on and how to report, not what is learned.
RESUMABLE = ("total_timesteps", "gradient_steps", "checkpoint_frequency", "eval_frequency", "eval_episodes", "progress", "sample_threads",
             "steps_per_call", "ray_address", "lease_ttl", "actor_restarts", "overlap_envs")
#: Flags that ``--evaluate`` accepts: which games to play and how (the run's saved arguments give the rest).
EVALUATE = ("eval_episodes", "eval_epsilon", "seed", "num_envs", "env_id", "env_kwargs")
#: Games ``--evaluate`` plays without --eval-episodes, of a run that was not evaluated.
EVALUATE_EPISODES = 10
ARGS_FILE = "args.json"
#: --overlap-envs' values
OVERLAP = ("auto", "on", "off")
#: Defaults the help text states in words instead (an empty string or 0 that means "pick for me").
UNSTATED = ("run_dir", "store", "offline", "init_from", "frame_stack", "steps_per_call", "ray_address", "info_keys",
            "env_kwargs", "model")
#: Flags of acting, which an --offline run does not do (its length is --gradient-steps, its frames the store's).
ONLINE_ONLY = ("total_timesteps", "store", "lease_ttl", "buffer_size", "num_envs", "start_e", "end_e",
               "exploration_fraction", "learning_starts", "clip_reward", "replay_ratio", "actors", "actor_restarts",
               "ray_address", "frame_stack", "overlap_envs", "info_keys")


def _help(field: dataclasses.Field[Any]) -> str:
    text = str(field.metadata["help"])
    if field.name in UNSTATED or "default" in text:
        return text
    default = field.default
    if isinstance(default, bool):
        shown = f"--{field.name.replace('_', '-')}" if default else f"--no-{field.name.replace('_', '-')}"
    elif isinstance(default, int) and not isinstance(default, bool) and abs(default) >= 10_000:
        shown = f"{default:_}"
    else:
        shown = str(default)
    return f"{text} (default: {shown})"


def _add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``Args`` field (``--flag`` / ``--no-flag`` for booleans)."""
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, dest=field.name, action=argparse.BooleanOptionalAction, help=_help(field))
        else:
            kind = {"int": int, "float": float, "str": str}[field.type if isinstance(field.type, str) else field.type.__name__]
            parser.add_argument(flag, dest=field.name, type=kind, metavar=field.name.upper(), help=_help(field))


def build_parser() -> argparse.ArgumentParser:
    """The command line. Flags not given are absent from the parsed namespace (``argument_default``
    is SUPPRESS), which is how ``parse`` tells what was given from what was defaulted."""
    parser = argparse.ArgumentParser(
        prog="replaystore-train", argument_default=argparse.SUPPRESS,
        description="Train a DQN (Keras 3) on a gymnasium environment; the replay buffer is a replaystore on disk. "
                    "The same agent is a Python API: replaystore.trainer.DQN (docs/trainer.md).",
        epilog="Resume a stopped or crashed run with: replaystore-train --resume RUN_DIR [--total-timesteps N]",
    )
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR with its saved arguments; only "
                             + ", ".join("--" + n.replace("_", "-") for n in RESUMABLE) + " may be given, and are saved")
    parser.add_argument("--evaluate", metavar="RUN_DIR",
                        help="play --eval-episodes games (default: the run's --eval-episodes, or 10) with the last checkpoint of the run in RUN_DIR (it may "
                             "still be running), print their scores and write nothing there; only "
                             + ", ".join("--" + n.replace("_", "-") for n in EVALUATE) + " and --video may be given")
    parser.add_argument("--video", metavar="FILE",
                        help="with --evaluate: record the first game's screen as FILE.mp4 (any length) or FILE.gif")
    _add_flags(parser)
    return parser


@dataclasses.dataclass
class Command:
    """What the command line asks for: ``mode`` is ``train`` (a new run), ``resume`` or ``evaluate``
    (with ``video``, the file --video names, or "")."""

    args: Args
    mode: str
    video: str = ""


def parse(argv: list[str] | None) -> Command:
    """Parse the command line into ``Args`` and what to do with them: a new run, a resumed one (then
    ``args.json`` is loaded, the flags given replace its values, and it is written back by
    ``save``), or an evaluation of one (``args.json`` loaded, never written)."""
    given = vars(build_parser().parse_args(argv))
    resume = given.pop("resume", None)
    evaluate, video = given.pop("evaluate", None), given.pop("video", None)
    if video is not None and evaluate is None:
        raise TrainerError("--video records a game of --evaluate RUN_DIR; give --evaluate too (a run's own evaluations "
                           "are not recorded)")
    if evaluate is not None:
        if resume is not None:
            raise TrainerError("--resume and --evaluate cannot be given together; resume the run, then evaluate it")
        return Command(evaluation(Path(evaluate), given), "evaluate", video or "")
    if resume is None:
        args = Args(**given)
        if args.offline and "://" not in args.offline:
            args.offline = str(Path(args.offline).resolve())  # (a --resume from elsewhere finds it too)
        if args.init_from:
            args.init_from = str(Path(args.init_from).resolve())
        if args.offline and "env_id" not in given:
            args.env_id = ""  # offline, the env is only evaluated on: none unless named
        if not args.run_dir:
            name = f"offline-{Path(args.offline).stem}" if args.offline else re.sub(r"[/:]", "_", args.env_id)
            args.run_dir = str(Path("runs") / f"{name}-{args.seed}")
        check_mode(args, set(given))
        check(args)
        return Command(args, "train")
    args = load(Path(resume))
    resumable = RESUMABLE + (("env_id",) if args.offline else ())  # (offline, the env is only evaluated on)
    changed = sorted(set(given) - set(resumable))
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise TrainerError(f"{flags} cannot change when resuming; --resume takes the run's saved arguments and only "
                           f"{', '.join('--' + n.replace('_', '-') for n in resumable)}")
    for name, value in given.items():
        setattr(args, name, value)
    args.run_dir = resume
    check_mode(args, set(given))
    check(args)
    return Command(args, "resume")


def evaluation(run_dir: Path, given: dict[str, Any]) -> Args:
    """The arguments of ``--evaluate RUN_DIR``: the run's, with the EVALUATE flags given over them;
    with another --env-id, the run's --env-kwargs are left out unless given again."""
    try:
        args = load(run_dir)
    except TrainerError as exc:
        raise TrainerError(str(exc).replace("cannot resume:", "cannot evaluate:")) from None
    other = sorted(set(given) - set(EVALUATE))
    if other:
        flags = ", ".join("--" + name.replace("_", "-") for name in other)
        raise TrainerError(f"{flags} cannot be given with --evaluate; it plays the run's checkpoint and takes only "
                           f"{', '.join('--' + n.replace('_', '-') for n in EVALUATE)} and --video")
    if "env_id" in given and given["env_id"] != args.env_id and "env_kwargs" not in given:
        args.env_kwargs = ""
    for name, value in given.items():
        setattr(args, name, value)
    args.run_dir = str(run_dir)
    if "eval_episodes" not in given:
        args.eval_episodes = args.eval_episodes or EVALUATE_EPISODES  # (the run's own evaluations', or 10)
    if args.eval_episodes < 1:
        raise TrainerError(f"--eval-episodes is {args.eval_episodes}; --evaluate plays at least one game")
    _check_playing(args)
    if not args.env_id:
        raise TrainerError(f"{run_dir} is an --offline run without an env; give --env-id, the gymnasium id of the env "
                           "its store was written from")
    env_kwargs(args)
    return args


def check_mode(args: Args, given: set[str]) -> None:
    """Refuse flags that the run's mode does not use: acting's with --offline, --gradient-steps
    without it; and an --offline evaluation on a defaulted --env-id."""
    if not args.offline:
        if "gradient_steps" in given:
            raise TrainerError("--gradient-steps counts the gradient steps of an --offline run; an online run's "
                               "length is --total-timesteps (env steps)")
        return
    unused = sorted(given & set(ONLINE_ONLY))
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        raise TrainerError(f"{flags} cannot be given with --offline: an offline run acts nowhere; its length is "
                           "--gradient-steps and its frames, stack and actions are the store's")
    if args.eval_episodes and not args.env_id:
        raise TrainerError("--offline with --eval-episodes needs --env-id: the gymnasium id of the env the store "
                           "was written from, to evaluate on (ALE/ ids get replaystore-train's wrappers)")
    if args.her_n_sampled_goal and not args.env_id:
        raise TrainerError("--offline with --her-n-sampled-goal needs --env-id: the gymnasium id of the goal env "
                           "the store was written from, whose compute_reward gives the relabelled rewards")


def check(args: Args) -> None:
    """Refuse values no run can use, naming the flag and its range."""
    positive = ("total_timesteps", "gradient_steps", "buffer_size", "checkpoint_frequency", "cache_mb")
    for name in positive:
        if getattr(args, name) < (0 if name == "cache_mb" else 1):
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be a positive integer")
    for name in ("eval_frequency", "eval_episodes", "frame_stack"):
        if getattr(args, name) < 0:
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 0")
    _check_playing(args)
    try:
        settings = config(args)
    except TrainerError as exc:
        raise TrainerError(as_flags(str(exc))) from None
    if args.buffer_size < max(args.batch_size, 2):
        raise TrainerError(f"--buffer-size {args.buffer_size} is smaller than --batch-size {args.batch_size}; "
                           "the replay store must hold at least one batch (DQN usually keeps 10^5-10^6 steps)")
    if args.overlap_envs not in OVERLAP:
        raise TrainerError(f"--overlap-envs is {args.overlap_envs!r}; it must be one of {', '.join(OVERLAP)}")
    if not 0 <= args.actors <= 256:
        raise TrainerError(f"--actors is {args.actors}; it must be between 0 and 256")
    if not 0 <= args.actor_restarts <= 1000:
        raise TrainerError(f"--actor-restarts is {args.actor_restarts}; it must be between 0 and 1000")
    if args.actors and settings.ratio() <= 0:
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
    extras(args)
    env_kwargs(args)


def _check_playing(args: Args) -> None:
    """The flags of playing, for a run and for --evaluate: --eval-epsilon and --num-envs."""
    if not 0.0 <= args.eval_epsilon <= 1.0:
        raise TrainerError(f"--eval-epsilon is {args.eval_epsilon}; it must be in [0, 1]")
    if not 1 <= args.num_envs <= 1024:
        raise TrainerError(f"--num-envs is {args.num_envs}; it must be between 1 and 1024")


def model_builder(args: Args) -> Callable[..., Any] | None:
    """--model's function (None without it), its module imported; TrainerError naming the flag when
    it is not ``module:function``, the module cannot be imported or has no such function."""
    if not args.model:
        return None
    module_name, _, attribute = args.model.partition(":")
    if not module_name or not attribute:
        raise TrainerError(f"--model is {args.model!r}; give module:function, such as mymodels:build (called as "
                           "build(observation_space, n_actions, frame_stack))")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainerError(f"--model {args.model}: the module {module_name!r} cannot be imported ({exc}); install it, "
                           "or put its folder on PYTHONPATH") from None
    function: Any = module
    for part in attribute.split("."):
        function = getattr(function, part, None)
    if not callable(function):
        raise TrainerError(f"--model {args.model}: {module_name} has no function {attribute!r}")
    return function


def env_kwargs(args: Args) -> dict[str, Any] | None:
    """--env-kwargs as ``gym.make``'s keywords (None without it); TrainerError naming the flag for
    anything but a JSON object, or, with an ALE id, for anything but ``envs.ATARI_SETTINGS``."""
    if not args.env_kwargs.strip():
        return None
    try:
        kwargs = json.loads(args.env_kwargs)
    except ValueError as exc:
        kwargs = exc
    if not isinstance(kwargs, dict) or not kwargs:
        raise TrainerError(f"--env-kwargs is {args.env_kwargs!r}; give a JSON object of gym.make's keywords, such as "
                           "'{\"is_slippery\": false}'")
    if is_atari(args.env_id):
        try:
            atari_settings(args.env_id, kwargs)
        except TrainerError as exc:
            raise TrainerError(f"--env-kwargs: {exc}") from None
    return kwargs


def extras(args: Args) -> dict[str, str] | None:
    """--info-keys as ``ReplayStore.create``'s ``extras`` (None without it); TrainerError naming the
    flag for a name or dtype the store does not keep."""
    if not args.info_keys.strip():
        return None
    from replaystore.errors import ConfigError
    from replaystore.format.extras import extras_from_arg

    out: dict[str, str] = {}
    for item in args.info_keys.split(","):
        name, _, dtype = item.strip().partition(":")
        if name in out:
            raise TrainerError(f"--info-keys names {name!r} twice; name each key once")
        out[name] = dtype.strip() or "float32"
    try:
        extras_from_arg(out)
    except ConfigError as exc:
        raise TrainerError(f"--info-keys {args.info_keys!r}: {exc}; give NAME[:DTYPE],... such as "
                           "is_success:bool,lives:int32") from None
    return out


def as_flags(message: str) -> str:
    """An API message in the command line's words: a keyword it names (its first word, or any
    ``snake_case`` one, ``name=value`` too) becomes the flag (``--name-with-dashes [value]``); a
    word inside quotes, a path or a dotted name, or a key before ``:``, stays as it is."""
    known = {field.name for field in dataclasses.fields(Args)}

    def flag(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if name not in known or ("_" not in name and match.start()):
            return match.group(0)
        return "--" + name.replace("_", "-") + (f" {value}" if value is not None else "")

    # (not inside a quoted value, a path, a dotted name or as a key: 'batch_size', runs/run_dir/x, env.seed,
    # {batch_size: ...})
    return re.sub(r"(?<![\w/'\".-])([a-z]+(?:_[a-z]+)*)(?![\w/'\":])(?:=(\S+?)(?=[,;:)\s]|$))?", flag, message)


def config(args: Args) -> DQNConfig:
    """The hyperparameters among the flags, checked (reward clipping and life loss for ALE ids only)."""
    atari = is_atari(args.env_id)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DQNConfig) if hasattr(args, f.name)}
    values.update(clip_reward=atari and args.clip_reward, terminal_on_life_loss=atari and args.terminal_on_life_loss)
    settings = DQNConfig(**values)
    settings.check()
    if settings.replay_ratio != "auto":
        settings.replay_ratio = settings.ratio()
    return settings


def num_streams(args: Args) -> int:
    """The store's streams: one per env, of every actor process."""
    return args.num_envs * max(1, args.actors)


def hidden_sizes(args: Args) -> list[int]:
    try:
        sizes = [int(s) for s in args.hidden_sizes.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise TrainerError(f"--hidden-sizes is {args.hidden_sizes!r}; give layer widths like 120,84")
    return sizes


def store_path(args: Args) -> str | Path:
    """Where the run's replay store is: ``--store`` (a URL), else RUN_DIR/replay.zarr."""
    return args.store or Path(args.run_dir) / "replay.zarr"


def store_options(args: Args) -> dict[str, Any]:
    """``ReplayStore.open``/``create`` keywords for the run's store (the lease of a store at a URL)."""
    return {"storage_options": {"lease_ttl": args.lease_ttl}} if args.store else {}


def save(args: Args, run_dir: Path) -> None:
    """Write ``args.json`` (atomically: a resume reads it back)."""
    from .checkpoint import write_atomically

    write_atomically(run_dir / ARGS_FILE, (json.dumps(dataclasses.asdict(args), indent=2) + "\n").encode())


def load(run_dir: Path) -> Args:
    path = run_dir / ARGS_FILE
    if not run_dir.is_dir():
        raise TrainerError(f"cannot resume: {run_dir} does not exist; pass the --run-dir of an earlier run")
    if not path.is_file():
        raise TrainerError(f"cannot resume: {run_dir} holds no run ({ARGS_FILE} is missing); "
                           "start a new run with --run-dir instead")
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise TypeError(f"it holds {type(saved).__name__}, not an object of flags")
        fields = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in dataclasses.fields(Args)}
        for name, value in saved.items():
            kind = fields.get(name)
            if kind == "str" and isinstance(value, int | float) and not isinstance(value, bool):
                saved[name] = value = str(value)  # (--replay-ratio was a number in releases before "auto")
            wanted = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}.get(str(kind), ())
            if kind is not None and (not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool))):
                raise TypeError(f"{name} is {value!r}, not {'a' if kind != 'int' else 'an'} {kind}")
        return Args(**{k: v for k, v in saved.items() if k in fields})
    except (ValueError, TypeError) as exc:
        raise TrainerError(f"cannot resume: {path} is not a valid arguments file ({exc}); put back a copy of it, or "
                           "start a new run") from exc
