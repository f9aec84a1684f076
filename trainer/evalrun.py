"""``replaystore-train --evaluate RUN_DIR``: the run's last checkpoint playing games, their scores
printed, and with ``--video FILE`` the first game's screen recorded (video.py).

Nothing is written into the run directory: the checkpoint and ``args.json`` are read, the store is
opened read-only (``load_run``), so a run may be evaluated while it goes on. A run directory copied
without its store plays too (the network made for the env's frames), and with ``--best`` without
its checkpoint: ``args.json`` and ``best.npz`` are enough. The env is the run's
(``--env-id`` and ``--env-kwargs`` as recorded, or as given); the games are played as the run's
evaluations play them (whole games, all lives, raw scores; side by side on up to ``EVAL_ENVS`` envs
for a run of ``--num-envs`` > 1), with ``--eval-epsilon``-random moves and seeds from ``--seed``.
With ``--video`` they are played on one env that renders its screen (``render_mode="rgb_array"``:
Atari's full 210x160 colour screen, not the agent's 84x84 gray frames).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from . import args as arguments
from . import checkpoint
from .args import Args
from .config import TrainerError
from .envs import atari_settings, is_atari, make_env, make_vector_env
from .process import stop_signals
from .rundir import load_run
from .video import RecordGame, check_video_path, video_file

#: Evaluations play up to this many games at once, on a vector env (a run's with --num-envs > 1).
EVAL_ENVS = 32


@contextlib.contextmanager
def evaluation_env(args: Args, *, vector: bool) -> Iterator[Any]:
    """The evaluation env (with --eval-episodes; else None), closed after the block: with ``vector``
    the games are played side by side, one per env (up to EVAL_ENVS)."""
    env = None
    if args.eval_episodes and vector:
        env = make_vector_env(args.env_id, min(args.eval_episodes, EVAL_ENVS), kwargs=arguments.env_kwargs(args))
    elif args.eval_episodes:
        env = make_env(args.env_id, arguments.env_kwargs(args))
    try:
        yield env
    finally:
        if env is not None:
            env.close()


def evaluate_run(args: Args, *, video: str = "", best: bool = False) -> int:
    """Play ``args.eval_episodes`` games with the checkpoint of the run in ``args.run_dir`` (``args``
    as cmdline.py's ``evaluation`` makes them), print their scores, and record the first one's
    screen into ``video`` when given; with ``best``, the weights of the run's highest evaluation
    (``best.npz``) play instead of the last checkpoint's. Returns the exit status (128 + the signal
    for SIGINT or SIGTERM, which stop it with no video written)."""
    run_dir = Path(args.run_dir)
    out = check_video_path(video) if video else None
    kept = checkpoint.load_best(run_dir) if best else None
    if best and kept is None:
        raise TrainerError(f"{run_dir} holds no {checkpoint.BEST}: a run keeps its best evaluation's weights only when "
                           "it evaluates (--eval-episodes), and this one has not evaluated yet; leave out --best to play "
                           "its last checkpoint")
    try:
        with stop_signals() as stop:  # (SIGINT, SIGTERM recorded; _Checked raises them at the next move)
            _evaluate(args, run_dir, out, stop, None if kept is None else kept[1])
    except _Stopped as stopped:
        name = signal.Signals(stopped.signum).name
        print(f"stopped by {name}" + (f"; no video written to {out}" if out else ""), flush=True)
        return 128 + stopped.signum
    return 0


class _Stopped(Exception):
    """SIGINT or SIGTERM, raised at the next move (``_Checked``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Checked:
    """``env`` (a gymnasium env or a vector env, as it is) that raises ``_Stopped`` before and after
    each reset and step once ``stop`` holds a signal (``process.stop_signals`` records them: a
    handler that raised would raise wherever the interpreter happened to be, such as inside JAX's
    garbage-collection callback, where an exception is printed and dropped, or inside TensorFlow's
    AutoGraph, which took it for a conversion failure; both happened)."""

    def __init__(self, env: Any, stop: list[int]) -> None:
        self._env, self._stop = env, stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def check(self) -> None:
        if self._stop:
            raise _Stopped(self._stop[0])

    def reset(self, **kwargs: Any) -> Any:
        self.check()
        out = self._env.reset(**kwargs)
        self.check()
        return out

    def step(self, actions: Any) -> Any:
        self.check()
        out = self._env.step(actions)
        self.check()
        return out


def _evaluate(args: Args, run_dir: Path, out: Path | None, stop: list[int], best: dict[str, Any] | None) -> None:
    from .report import shown  # (it imports Keras: not before the arguments are checked)

    with _env(args, out) as (played_on, recorder):
        env = _Checked(played_on, stop)
        agent = load_run(run_dir, best=best is not None, model=args.model or None,  # (as checked: the user's own)
                         env_id=args.env_id or None)  # (Keras loads here, once the env and video are good)
        try:
            env.check()
            unit = "gradient step" if args.offline else "step"
            at = f"{unit} {agent.state.train_steps if args.offline else agent.state.global_step:,}"
            weights = f"its checkpoint at {at}" if best is None else \
                f"its best weights, from the evaluation at {unit} {best['step']:,}: mean score {shown(best['mean_return'])}"
            how = "greedy" if args.eval_epsilon == 0 else f"epsilon {args.eval_epsilon:g}"
            print(f"evaluating {run_dir} ({weights}) on {args.env_id}: {_games(args.eval_episodes)}, {how}", flush=True)
            started, games = time.monotonic(), itertools.count(1)

            def ended(score: float) -> None:  # (a long Atari game shows its end, not minutes of silence)
                print(f"game {next(games)}/{args.eval_episodes}: {score:g}  ({time.monotonic() - started:,.0f} s)",
                      flush=True)

            played = agent.play(env, args.eval_episodes, epsilon=args.eval_epsilon, seed=args.seed + 100_000,
                                on_game=ended)
        finally:
            agent.close()
        returns = np.asarray(played.returns)
        print("scores: " + ", ".join(f"{r:g}" for r in returns))
        line = (f"mean score {shown(float(returns.mean()))} over {_games(returns.size)} (min {returns.min():g}, "
                f"max {returns.max():g})")
        if played.successes:
            line += f"; success rate {np.mean(played.successes):.2f}"
        print(line)
        if recorder is not None:
            _commit(recorder)


@contextlib.contextmanager
def _env(args: Args, out: Path | None) -> Iterator[tuple[Any, RecordGame | None]]:
    """The env the games are played on, and with ``out`` the recorder of the first game (its video
    file discarded unless committed); the env's screen is checked before anything else happens."""
    if out is None:
        with evaluation_env(args, vector=args.num_envs > 1) as env:
            yield env, None
        return
    env = make_env(args.env_id, arguments.env_kwargs(args), render=True)
    video = video_file(out, _fps(args, env))
    try:
        env.reset(seed=args.seed)
        recorder = RecordGame(env, video)
        recorder.check_screen()
        yield recorder, recorder
    finally:
        video.discard()  # (nothing after a commit)
        env.close()


def _games(n: int) -> str:
    return "1 game" if n == 1 else f"{n} games"


def _fps(args: Args, env: Any) -> float:
    """A move's screens at the game's own speed: Atari's 60 frames a second over its frame skip,
    else the env's ``render_fps`` (30 when it has none)."""
    if is_atari(args.env_id):
        return 60.0 / atari_settings(args.env_id, arguments.env_kwargs(args))["frameskip"]
    return float(env.metadata.get("render_fps") or 30)


def _commit(recorder: RecordGame) -> None:
    video = recorder.video
    if not recorder.recorded:
        raise TrainerError("the first game did not end; no video was written")
    path = video.commit()
    note = (f"; the .gif holds its first {video.frames:,} of {video.frames + video.left_out:,} frames: name the video "
            ".mp4 for the whole game") if video.left_out else ""
    print(f"video of the first game: {path} ({video.frames:,} frames at {video.fps:g} a second){note}")
