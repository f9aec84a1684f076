"""The command line's flags: one ``Args`` dataclass (cleanrl's names), the checks of their values
and what they mean for a run (``config``, ``env_kwargs``, ``extras``, the store's path), and the
run's ``args.json`` (``save``, ``load``). The parser, and which flags a new run, ``--resume`` and
``--evaluate`` take, are cmdline.py's.

The hyperparameters among the flags are declared once, in config.py (``Hyperparameters``: each
one's default and help), which ``Args`` extends with the run's own flags; ``config(args)`` makes a
``DQNConfig`` of them, whose checks name the flags (``config.FLAGS``).
The run's length and buffer default to a real Atari run on a GPU machine (cleanrl's dqn_atari.py:
10M steps, a 1M buffer); the hyperparameters not given take their preset's values (config.PRESETS)
once the env's observations are known (``fill_presets``): cleanrl's for image frames (learning from
step 80k), the classic-control ones for anything else.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replaystore.storage.readfile import read_text

from .config import FLAGS, PRESETS, DQNConfig, Hyperparameters, TrainerError, help_of, image_frames, preset
from .envs import atari_settings, is_atari


@dataclasses.dataclass
class Args(Hyperparameters):
    """The command line's flags: the hyperparameters (declared once, with their help, in config.py's
    ``Hyperparameters``) and the run's own flags below. Reward clipping and life loss default to on
    here, for ALE ids only (``config``)."""

    env_id: str = dataclasses.field(default="ALE/Breakout-v5", metadata={"help": "gymnasium id with a Discrete action space"})
    env_kwargs: str = dataclasses.field(default="", metadata={"help": "keywords for gym.make, as a JSON object, such as '{\"is_slippery\": false}'; ALE ids take repeat_action_probability (sticky actions; 0.25), full_action_space (false), max_num_frames_per_episode (108000), noop_max (30), frameskip (4)"})
    total_timesteps: int = dataclasses.field(default=10_000_000, metadata={"help": "environment steps of the whole run"})
    run_dir: str = dataclasses.field(default="", metadata={"help": "where the store, checkpoint, logs and args go (default runs/<env>-<seed>)"})
    store: str = dataclasses.field(default="", metadata={"help": "put the replay store at this URL (s3://bucket/prefix/replay.zarr; endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) instead of RUN_DIR/replay.zarr"})
    offline: str = dataclasses.field(default="", metadata={"help": "learn offline from this existing replay store (a path or URL), read-only: gradient steps on its transitions, acting nowhere; the env is only for --eval-episodes (docs/trainer.md)"})
    gradient_steps: int = dataclasses.field(default=100_000, metadata={"help": "with --offline: gradient steps of the whole run"})
    init_from: str = dataclasses.field(default="", metadata={"help": "start a new run from the online and target weights of an earlier one (its RUN_DIR, online or --offline, or a directory DQN.save wrote), with a fresh optimizer and counters: pretrain with --offline, then fine-tune online"})
    lease_ttl: float = dataclasses.field(default=30.0, metadata={"help": "with --store URL: seconds a writer's lease on its streams lasts unrenewed; a crashed writer's streams are taken over after that"})
    buffer_size: int = dataclasses.field(default=1_000_000, metadata={"help": "replay store capacity in steps (on disk)"})
    num_envs: int = dataclasses.field(default=1, metadata={"help": "environments stepped together, each writing its own stream of the store (ALE ids: ale-py's AtariVectorEnv)"})
    overlap_envs: str = dataclasses.field(default="auto", metadata={"help": "ALE ids with --num-envs >= 2: on steps the envs as two halves in turn, one half's envs stepping while the other half's moves are written and its next actions picked (the forward pass); off steps them all at once; auto is on where Keras computes on a GPU"})
    info_keys: str = dataclasses.field(default="", metadata={"help": "keep these keys of the env's infos with each move, as the store's extras (replaystore episodes shows them at each episode's end, inspect their statistics): NAME[:DTYPE],... such as is_success:bool,lives:int32 (DTYPE float32 unless given; a move whose info lacks a key keeps 0)"})
    model: str = dataclasses.field(default="", metadata={"help": "your own Q-network: module:function, called as function(observation_space, n_actions, frame_stack) for a keras.Model from the store's stacks (batch, frame_stack, *frame) to one Q-value per action (the module is imported: put its folder on PYTHONPATH); default: nature_cnn for images, mlp for vectors (--hidden-sizes), embedded_mlp for a Discrete, dict_mlp for Dicts and Tuples"})
    dueling: bool = dataclasses.field(default=False, metadata={"help": "the default Q-network with a dueling head (Wang et al. 2016: a state value and each action's advantage over their mean); not with --model, whose function builds its own head"})
    hidden_sizes: str = dataclasses.field(default="120,84", metadata={"help": "MLP layer widths for vector, Dict and Tuple observations"})
    frame_stack: int = dataclasses.field(default=0, metadata={"help": "frames per observation (default: 4 for images, 1 for vectors)"})
    checkpoint_frequency: int = dataclasses.field(default=100_000, metadata={"help": "steps between checkpoints"})
    eval_frequency: int = dataclasses.field(default=0, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_episodes: int = dataclasses.field(default=0, metadata={"help": "episodes per evaluation (0: no evaluation); with --num-envs > 1 played side by side on up to 32 envs"})
    eval_epsilon: float = dataclasses.field(default=0.0, metadata={"help": "epsilon while evaluating"})
    cache_mb: int = dataclasses.field(default=256, metadata={"help": "the store's compressed-chunk cache in MiB"})
    actors: int = dataclasses.field(default=0, metadata={
        "help": "Ray actor processes that act, each stepping --num-envs envs into its own streams of the store, "
                "while this process learns (0: act in this process)"})
    actor_restarts: int = dataclasses.field(default=3, metadata={
        "help": "with --actors: how many times one actor may die and be restarted on its streams before the run "
                "ends with its error"})
    ray_address: str = dataclasses.field(default="", metadata={
        "help": "with --actors: the address of a running Ray cluster to join (default: start a local Ray)"})
    progress: bool = dataclasses.field(default=True, metadata={"help": "show a live progress bar on a terminal (elsewhere, and with --no-progress: a log line every 30 s)"})
    clip_reward: bool = dataclasses.field(default=True, metadata=help_of("clip_reward"))
    terminal_on_life_loss: bool = dataclasses.field(default=True, metadata=help_of("terminal_on_life_loss"))


ARGS_FILE = "args.json"
#: --overlap-envs' values
OVERLAP = ("auto", "on", "off")
def check(args: Args) -> None:
    """Refuse values no run can use, naming the flag and its range."""
    positive = ("total_timesteps", "gradient_steps", "buffer_size", "checkpoint_frequency", "cache_mb")
    for name in positive:
        if getattr(args, name) < (0 if name == "cache_mb" else 1):
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be a positive integer")
    for name in ("eval_frequency", "eval_episodes", "frame_stack"):
        if getattr(args, name) < 0:
            raise TrainerError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 0")
    check_playing(args)
    settings = config(args)
    if args.overlap_envs not in OVERLAP:
        raise TrainerError(f"--overlap-envs is {args.overlap_envs!r}; it must be one of {', '.join(OVERLAP)}")
    if not 0 <= args.actors <= 256:
        raise TrainerError(f"--actors is {args.actors}; it must be between 0 and 256")
    if not 0 <= args.actor_restarts <= 1000:
        raise TrainerError(f"--actor-restarts is {args.actor_restarts}; it must be between 0 and 1000")
    if args.actors and settings.replay_ratio != "auto" and settings.ratio() <= 0:
        raise TrainerError("--actors needs the decoupled learner: give --replay-ratio auto or a number > 0, not 0")
    streams = num_streams(args)
    if args.buffer_size % streams:
        lower = args.buffer_size - args.buffer_size % streams
        over = f"--num-envs {args.num_envs}" + (f" x --actors {args.actors}" if args.actors else "")
        raise TrainerError(f"--buffer-size {args.buffer_size} does not split evenly over {over} "
                           f"(each env writes its own stream); use {lower} or {lower + streams}")
    check_sizes(args)
    if args.dueling and args.model:
        raise TrainerError(f"--dueling asks for the default Q-network's dueling head, but --model {args.model} builds "
                           "the network: leave out --dueling, or end your model with replaystore.trainer.Dueling(n_actions)")
    hidden_sizes(args)
    extras(args)
    env_kwargs(args)


def check_sizes(args: Args) -> None:
    """Refuse a buffer smaller than a batch or an n-step return (once those have their values)."""
    if args.batch_size is not None and args.buffer_size < max(args.batch_size, 2):
        raise TrainerError(f"--buffer-size {args.buffer_size} is smaller than --batch-size {args.batch_size}; "
                           "the replay store must hold at least one batch (DQN usually keeps 10^5-10^6 steps)")
    if args.n_step is not None and args.n_step >= args.buffer_size // num_streams(args):
        raise TrainerError(f"--n-step {args.n_step} must be smaller than --buffer-size {args.buffer_size}")


def fill_presets(args: Args, observation_space: Any) -> None:
    """Give the hyperparameters not given their preset's values for these observations (image
    frames or not), as ``DQN`` does, so that args.json, the actors and a resume hold them."""
    for name, value in preset(image_frames(observation_space), hindsight=bool(args.her_n_sampled_goal)).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    check_sizes(args)


def check_playing(args: Args) -> None:
    """The flags of playing, for a run and for --evaluate: --eval-epsilon and --num-envs."""
    if not 0.0 <= args.eval_epsilon <= 1.0:
        raise TrainerError(f"--eval-epsilon is {args.eval_epsilon}; it must be in [0, 1]")
    if not 1 <= args.num_envs <= 1024:
        raise TrainerError(f"--num-envs is {args.num_envs}; it must be between 1 and 1024")


def q_network(args: Args, space: Any, frame_stack: int, n_actions: int, *,
              builder: Callable[..., Any] | None = None) -> Any:
    """The run's Q-network for its observation space: ``builder``'s or --model's, else the default one
    (--hidden-sizes, --dueling); Keras is imported here."""
    from .models import q_network_for

    return q_network_for(space, frame_stack, n_actions, hidden_sizes=hidden_sizes(args), dueling=args.dueling,
                         builder=builder or model_builder(args))


def code_named(args: Args) -> dict[str, str]:
    """The flags of a run that name code to import: ``--model`` (module:function), and an
    ``--env-id`` of the form ``module:Name-v0`` (gymnasium imports the module)."""
    named = {"model": args.model} if args.model else {}
    if ":" in args.env_id:
        named["env_id"] = args.env_id
    return named


def check_code_given(saved: Args, given: dict[str, Any], run_dir: Path, *, how: str, same_env: bool) -> set[str]:
    """A run directory is data, never code: what its ``args.json`` names to import (``code_named``)
    is imported only when the user names it again, as ``how`` says (their own command line or call):
    ``--model`` the same, and ``--env-id`` the same (``same_env``) or any other. Returns the names
    of those flags given as the run has them (which --resume may then be given)."""
    repeated = set()
    for name, value in code_named(saved).items():
        flag = "--" + name.replace("_", "-")
        again = given.get(name)
        if again is None or (again != value and (name == "model" or same_env)):
            raise TrainerError(f"{run_dir / ARGS_FILE} names {flag} {value}, code to import, and a run directory is "
                               "data that never names code to run: if you trust that code, give "
                               f"{how.format(flag=flag, name=name, value=value)} yourself")
        if again == value:
            repeated.add(name)
    return repeated


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
    except (ValueError, RecursionError) as exc:  # (RecursionError: an object nested thousands deep)
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


def config(args: Args) -> DQNConfig:
    """The hyperparameters among the flags, checked, a bad value named by its flag (reward clipping
    and life loss for ALE ids only)."""
    atari = is_atari(args.env_id)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DQNConfig) if hasattr(args, f.name)}
    values.update(clip_reward=atari and args.clip_reward, terminal_on_life_loss=atari and args.terminal_on_life_loss)
    settings = DQNConfig(**values)
    settings.check(FLAGS)
    if settings.replay_ratio != "auto":
        settings.replay_ratio = settings.ratio(FLAGS)
    return settings


def num_streams(args: Args) -> int:
    """The store's streams: one per env, of every actor process."""
    return args.num_envs * max(1, args.actors)


#: Bounds on --hidden-sizes: a network that fits in memory (100M weights are 400 MB of float32, times
#: four with the target network and Adam's moments).
MAX_LAYERS, MAX_WIDTH, MAX_HIDDEN_WEIGHTS = 16, 65_536, 100_000_000


def hidden_sizes(args: Args) -> list[int]:
    try:
        sizes = [int(s) for s in args.hidden_sizes.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(sizes) > MAX_LAYERS:
        raise TrainerError(f"--hidden-sizes is {args.hidden_sizes!r}; give up to {MAX_LAYERS} layer widths like 120,84")
    weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
    if max(sizes) > MAX_WIDTH or weights > MAX_HIDDEN_WEIGHTS:
        raise TrainerError(f"--hidden-sizes {args.hidden_sizes} asks for {weights:,} weights between its layers (at most "
                           f"{MAX_HIDDEN_WEIGHTS:,}, each layer at most {MAX_WIDTH:,} wide); DQN's MLPs are a few "
                           "hundred wide, such as 256,256")
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
        saved = json.loads(read_text(path, what="an args.json"))
        if not isinstance(saved, dict):
            raise TypeError(f"it holds {type(saved).__name__}, not an object of flags")
        fields = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in dataclasses.fields(Args)}
        for name, value in saved.items():
            kind = fields.get(name)
            if kind in ("str", "str | float") and isinstance(value, int | float) and not isinstance(value, bool):
                saved[name] = value = str(value)  # (--replay-ratio was a number in releases before "auto")
            wanted = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,),
                      "str | float": (str, int, float)}.get(str(kind), ())
            if value is None and name in PRESETS["images"]:
                continue  # (left to the observations' preset: filled in when the run sees them)
            if kind is not None and (not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool))):
                raise TypeError(f"{name} is {value!r}, not {'a' if kind != 'int' else 'an'} {kind}")
        return Args(**{k: v for k, v in saved.items() if k in fields})
    except (ValueError, TypeError) as exc:
        raise TrainerError(f"cannot resume: {path} is not a valid arguments file ({exc}); put back a copy of it, or "
                           "start a new run") from exc
