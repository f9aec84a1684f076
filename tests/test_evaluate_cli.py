"""``replaystore-train --evaluate RUN_DIR [--video FILE]``: the run's checkpoint plays games (while
the run goes on, too), their scores are printed, nothing is written into the run directory, and the
first game's screen is recorded as an .mp4 or a .gif; what it cannot do is a one-line error."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_trainer_smoke import _start, _wait_for_checkpoint

from replaystore.trainer import load_run
from replaystore.trainer.cli import main


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _scores(out: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith("scores: "))
    return [float(x) for x in line.removeprefix("scores: ").split(", ")]


def test_a_running_run_is_evaluated_and_nothing_is_written_into_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    proc = _start(run, "--checkpoint-frequency", "500")
    try:
        state = _wait_for_checkpoint(run, proc, 500)
        assert main(["--evaluate", str(run), "--eval-episodes", "3"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"evaluating {run} (its checkpoint at step " in out and "CartPole-v1: 3 games, greedy" in out
        assert len(_scores(out)) == 3 and "mean score " in out and "over 3 games (min " in out
        assert [line.split(":")[0] for line in out.splitlines() if line.startswith("game ")] == \
            ["game 1/3", "game 2/3", "game 3/3"]  # each as it ends
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert state["global_step"] >= 500

    before = _listing(run)
    assert main(["--evaluate", str(run), "--seed", "7"]) == 0, capsys.readouterr().err
    scores = _scores(capsys.readouterr().out)
    assert len(scores) == 10  # the default
    agent = load_run(run)
    try:
        assert agent.evaluate(gym.make("CartPole-v1"), 10, seed=7 + 100_000) == scores  # the same games
    finally:
        agent.close()
    assert main(["--evaluate", str(run), "--num-envs", "2", "--eval-episodes", "4", "--eval-epsilon", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "4 games, epsilon 0.5" in out and len(_scores(out)) == 4
    assert _listing(run) == before


@pytest.mark.slow  # ~25 s: a trainer run, then its first game encoded twice (the default run keeps the other --evaluate tests)
def test_the_first_game_is_recorded_as_mp4_and_gif(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Pong run, evaluated on games cut at 400 frames (100 moves): the videos hold the screen after
    the reset and after each move of the first game, Atari's 210x160 in colour, at 15 frames a second."""
    import cv2
    from PIL import Image

    run = tmp_path / "run"
    assert main(["--env-id", "ALE/Pong-v5", "--total-timesteps", "200", "--buffer-size", "1000", "--batch-size", "8",
                 "--learning-starts", "100", "--sample-threads", "1", "--no-progress", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    short = ["--env-kwargs", '{"max_num_frames_per_episode": 400, "noop_max": 0}']
    mp4, gif = tmp_path / "pong.mp4", tmp_path / "pong.gif"
    assert main(["--evaluate", str(run), "--eval-episodes", "2", *short, "--video", str(mp4)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert len(_scores(out)) == 2 and f"video of the first game: {mp4} (101 frames at 15 a second)" in out
    capture, frames = cv2.VideoCapture(str(mp4)), []
    while (read := capture.read())[0]:
        frames.append(read[1])
    capture.release()
    assert len(frames) == 101 and frames[0].shape == (210, 160, 3)
    assert np.ptp(frames[50].astype(int), axis=(0, 1)).max() > 100 and not np.all(frames[50][..., 0] == frames[50][..., 1])

    assert main(["--evaluate", str(run), "--eval-episodes", "1", *short, "--video", str(gif)]) == 0
    assert f"video of the first game: {gif} (101 frames at 15 a second)" in capsys.readouterr().out
    with Image.open(gif) as image:
        assert image.size == (160, 210) and 2 <= image.n_frames <= 101  # (Pillow merges repeated screens)
        image.seek(image.n_frames // 2)
        assert len(image.convert("RGB").getcolors(256) or []) >= 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pong.gif", "pong.mp4", "run"]  # no part left beside them

    # SIGTERM while the first game is being recorded: exit 143, no video, no part of one, the older one kept
    proc = subprocess.Popen([sys.executable, "-m", "replaystore.trainer.cli", "--evaluate", str(run), "--eval-episodes",
                             "3", "--video", str(mp4)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".pong-*.part.mp4")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert f"stopped by SIGTERM; no video written to {mp4}" in out and "video of the first game" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pong.gif", "pong.mp4", "run"]
    assert len(frames) == 101 == int(cv2.VideoCapture(str(mp4)).get(cv2.CAP_PROP_FRAME_COUNT))


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("evaluate") / "run"
    assert main(["--env-id", "CartPole-v1", "--total-timesteps", "300", "--buffer-size", "1000", "--learning-starts",
                 "100", "--sample-threads", "1", "--no-progress", "--run-dir", str(run)]) == 0
    return run


@pytest.mark.parametrize(("argv", "message"), [
    (["--video", "x.mp4"], "--video records a game of --evaluate RUN_DIR; give --evaluate too"),
    (["--evaluate", "{run}", "--learning-rate", "0.1"], "--learning-rate cannot be given with --evaluate"),
    (["--evaluate", "{run}", "--resume", "{run}"], "--resume and --evaluate cannot be given together"),
    (["--evaluate", "{tmp}/nowhere"], "cannot evaluate: {tmp}/nowhere does not exist"),
    (["--evaluate", "{tmp}"], "cannot evaluate: {tmp} holds no run"),
    (["--evaluate", "{run}", "--eval-episodes", "0"], "--eval-episodes is 0; --evaluate plays at least one game"),
    (["--evaluate", "{run}", "--eval-epsilon", "2"], "--eval-epsilon is 2.0; it must be in [0, 1]"),
    (["--evaluate", "{run}", "--video", "{tmp}/x.avi"], "--video {tmp}/x.avi: name the file .mp4"),
    (["--evaluate", "{run}", "--video", "{tmp}/missing/x.gif"], "the folder {tmp}/missing does not exist"),
    (["--evaluate", "{run}", "--video", "{tmp}"], "is a directory; give a file name ending in .mp4 or .gif"),
    (["--evaluate", "{run}", "--env-id", "goal_env:BitFlip-v0", "--video", "{tmp}/x.gif"],
     "goal_env:BitFlip-v0 cannot show its screen: its constructor takes no render_mode; leave out --video"),
    (["--evaluate", "{run}", "--env-id", "FrozenLake-v1"], "the env gives frames of Discrete(16) with Discrete(4), but this agent's model takes stacks of (1, 4)"),
    (["--best"], "--best plays a run's best weights with --evaluate RUN_DIR; give --evaluate too"),
    (["--evaluate", "{run}", "--best"], "{run} holds no best.npz: a run keeps its best evaluation's weights only when "
                                        "it evaluates (--eval-episodes)"),
], ids=["video-alone", "training-flag", "resume-too", "no-folder", "no-run", "no-games", "epsilon", "suffix",
        "video-folder", "video-directory", "no-screen", "other-spaces", "best-alone", "no-best"])
def test_what_it_cannot_do_is_a_one_line_error(cartpole_run: Path, tmp_path: Path, argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    before = _listing(cartpole_run)
    fill = {"{run}": str(cartpole_run), "{tmp}": str(tmp_path)}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    assert main([filled(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and filled(message) in err and err.count("\n") == 1, err
    assert _listing(cartpole_run) == before and not os.listdir(tmp_path)


def test_the_best_evaluations_weights_are_kept_and_played(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run that evaluates keeps ``best.npz``: the weights of its highest evaluation so far, written
    when an evaluation beats the best before it (also across a resume). The decoupled learner is
    paused from an evaluation's start to its epoch's end, so they are exactly the weights that
    played: ``load_run(best=True)`` and ``--evaluate --best`` play that evaluation's games again,
    score for score."""
    import json

    from replaystore.trainer import TrainerError
    from replaystore.trainer.checkpoint import load_best, save_best

    run = tmp_path / "run"
    flags = ["--env-id", "CartPole-v1", "--buffer-size", "3000", "--batch-size", "32", "--learning-starts", "200",
             "--train-frequency", "1", "--target-network-frequency", "100", "--learning-rate", "0.001",
             "--eval-episodes", "3", "--eval-frequency", "400", "--sample-threads", "1",
             "--no-progress"]
    assert main([*flags, "--total-timesteps", "2000", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"best weights so far -> {run / 'best.npz'} (mean score " in out
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    means = [e["mean_return"] for e in evals]
    best = evals[means.index(max(means))]  # (the first of the highest: a tie does not replace it)
    weights, info = load_best(run)
    assert (info["step"], info["mean_return"], info["returns"]) == (best["step"], best["mean_return"], best["returns"])
    assert out.count("best weights so far") == sum(m > max(means[:i], default=-1e9) for i, m in enumerate(means))

    agent = load_run(run, best=True)
    try:
        assert agent.evaluate(gym.make("CartPole-v1"), 3) == best["returns"]  # the games it played then
        assert all(np.array_equal(a, b) for a, b in zip(agent.model.get_weights(), weights, strict=True))
    finally:
        agent.close()
    assert main(["--evaluate", str(run), "--best", "--eval-episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert f"its best weights, from the evaluation at step {best['step']:,}: mean score" in out
    assert _scores(out) == best["returns"]
    # brought elsewhere with only its flags and best weights (tools/gpu_suite.py brings those back): they play
    # the same games, built for the env's frames; nothing is written there
    only = tmp_path / "weights"
    only.mkdir()
    for name in ("args.json", "best.npz"):
        shutil.copy(run / name, only / name)
    assert main(["--evaluate", str(only), "--best", "--eval-episodes", "3"]) == 0
    assert _scores(capsys.readouterr().out) == best["returns"]
    agent = load_run(only, best=True)
    try:
        assert agent.evaluate(gym.make("CartPole-v1"), 3) == best["returns"] and agent.state.global_step == 0
    finally:
        agent.close()
    assert sorted(os.listdir(only)) == ["args.json", "best.npz"]
    assert main(["--evaluate", str(only)]) == 1
    err = capsys.readouterr().err
    assert "holds no checkpoint.npz" in err and "load with best=True (--evaluate --best)" in err, err

    assert main(["--resume", str(run), "--total-timesteps", "2800"]) == 0  # the best goes on from the one it had
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert len(evals) == len(means) + 2
    assert load_best(run)[1]["mean_return"] == max(e["mean_return"] for e in evals)
    (run / "best.npz").write_bytes(b"not an npz")  # damaged: a one-line error that says what to do
    assert main(["--evaluate", str(run), "--best"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'best.npz'} is damaged") and "delete it" in err and err.count("\n") == 1
    save_best(run, [np.zeros(3, "float32")], info)  # another network's weights: refused, saying what to do
    with pytest.raises(TrainerError, match=r"best.npz does not fit the run's Q-network .*delete it"):
        load_run(run, best=True)
