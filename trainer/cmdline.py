"""The command line of ``replaystore-train``: its parser (one flag per ``Args`` field, args.py), and
what each mode takes: a new run (every flag), ``--resume`` (the run's saved ``args.json`` wins; only
a few flags may change, and those given are recorded in it, so a later plain ``--resume`` goes on
with them) and ``--evaluate`` (the run's flags, with those of playing given over them; nothing is
written).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

from replaystore.storage.where import is_url, normalized

from .args import Args, check, check_code_given, check_playing, env_kwargs, load
from .config import PRESETS, Hyperparameters, TrainerError, described

#: Flags that ``--resume`` accepts: how long to go on and how to report, not what is learned.
RESUMABLE = ("total_timesteps", "gradient_steps", "checkpoint_frequency", "eval_frequency", "eval_episodes", "progress", "sample_threads",
             "steps_per_call", "ray_address", "lease_ttl", "actor_restarts", "overlap_envs")
#: Flags that ``--evaluate`` accepts: which games to play and how (the run's saved arguments give the rest).
EVALUATE = ("eval_episodes", "eval_epsilon", "seed", "num_envs", "env_id", "env_kwargs")
#: Games ``--evaluate`` plays without --eval-episodes, of a run that was not evaluated.
EVALUATE_EPISODES = 10
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
    if default is None and field.name in PRESETS["images"]:
        shown = described(field.name)
    elif isinstance(default, bool):
        shown = f"--{field.name.replace('_', '-')}" if default else f"--no-{field.name.replace('_', '-')}"
    elif isinstance(default, int) and not isinstance(default, bool) and abs(default) >= 10_000:
        shown = f"{default:_}"
    else:
        shown = str(default)
    return f"{text} (default: {shown})"


def _add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``Args`` field (``--flag`` / ``--no-flag`` for booleans): the run's own flags,
    then the hyperparameters (config.py declares them, with their help)."""
    hyper = {field.name for field in dataclasses.fields(Hyperparameters)}
    for field in sorted(dataclasses.fields(Args), key=lambda field: field.name in hyper):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, dest=field.name, action=argparse.BooleanOptionalAction, help=_help(field))
        else:
            kind = {"int": int, "float": float, "str": str, "str | float": str}[
                field.type if isinstance(field.type, str) else field.type.__name__]
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
                             + ", ".join("--" + n.replace("_", "-") for n in EVALUATE) + ", --video and --best may be given")
    parser.add_argument("--video", metavar="FILE",
                        help="with --evaluate: record the first game's screen as FILE.mp4 (any length) or FILE.gif")
    parser.add_argument("--best", action="store_true",
                        help="with --evaluate: play the weights of the run's highest evaluation (RUN_DIR/best.npz, "
                             "kept by runs with --eval-episodes) instead of its last checkpoint's")
    _add_flags(parser)
    return parser


@dataclasses.dataclass
class Command:
    """What the command line asks for: ``mode`` is ``train`` (a new run), ``resume`` or ``evaluate``
    (with ``video``, the file --video names, or "", and ``best``: --best)."""

    args: Args
    mode: str
    video: str = ""
    best: bool = False


def parse(argv: list[str] | None) -> Command:
    """Parse the command line into ``Args`` and what to do with them: a new run, a resumed one (then
    ``args.json`` is loaded, the flags given replace its values, and it is written back by
    ``save``), or an evaluation of one (``args.json`` loaded, never written)."""
    given = vars(build_parser().parse_args(argv))
    resume = given.pop("resume", None)
    evaluate, video, best = given.pop("evaluate", None), given.pop("video", None), given.pop("best", False)
    if video is not None and evaluate is None:
        raise TrainerError("--video records a game of --evaluate RUN_DIR; give --evaluate too (a run's own evaluations "
                           "are not recorded)")
    if best and evaluate is None:
        raise TrainerError("--best plays a run's best weights with --evaluate RUN_DIR; give --evaluate too (a run "
                           "keeps them by itself, in RUN_DIR/best.npz, when it evaluates)")
    if evaluate is not None:
        if resume is not None:
            raise TrainerError("--resume and --evaluate cannot be given together; resume the run, then evaluate it")
        return Command(evaluation(Path(evaluate), given), "evaluate", video or "", best)
    if resume is None:
        args = Args(**given)
        if args.offline and not is_url(args.offline):
            args.offline = normalized(args.offline)  # (a --resume from elsewhere finds it too)
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
    repeated = check_code_given(args, given, Path(resume), how="{flag} {value} on the command line", same_env=True)
    resumable = RESUMABLE + (("env_id",) if args.offline else ())  # (offline, the env is only evaluated on)
    changed = sorted(set(given) - set(resumable) - repeated)
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
    repeated = check_code_given(args, given, run_dir, how="{flag} {value} on the command line", same_env=False)
    other = sorted(set(given) - set(EVALUATE) - repeated)
    if other:
        flags = ", ".join("--" + name.replace("_", "-") for name in other)
        raise TrainerError(f"{flags} cannot be given with --evaluate; it plays the run's checkpoint and takes only "
                           f"{', '.join('--' + n.replace('_', '-') for n in EVALUATE)}, --video and --best")
    if "env_id" in given and given["env_id"] != args.env_id and "env_kwargs" not in given:
        args.env_kwargs = ""
    for name, value in given.items():
        setattr(args, name, value)
    args.run_dir = str(run_dir)
    if "eval_episodes" not in given:
        args.eval_episodes = args.eval_episodes or EVALUATE_EPISODES  # (the run's own evaluations', or 10)
    if args.eval_episodes < 1:
        raise TrainerError(f"--eval-episodes is {args.eval_episodes}; --evaluate plays at least one game")
    check_playing(args)
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
