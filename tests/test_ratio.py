"""The replay-ratio limiter and the decoupled trainer: the ratio held within its slack whichever side
is faster, neither side left waiting when the other stops, and whole runs with ``--replay-ratio``
(TensorFlow; JAX's in test_trainer_jax.py, behind the slow marker) that report the ratio, stop on SIGTERM and resume (on the
other backend) as lockstep runs do, and an environment that dies mid-run without hanging the learner."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_trainer_smoke import CARTPOLE, _scalars, _start, _train_here, _wait_for_checkpoint

from replaystore import ReplayStore
from replaystore.trainer import checkpoint
from replaystore.trainer.ratio import RatioLimiter


def _run(limiter: RatioLimiter, inserts: int, actor_pause: float, learner_pause: float) -> list[float]:
    """An actor inserting one step at a time and a learner taking calls, each pausing as given;
    returns how far the learner was from the target (in steps) at every actor step."""
    gaps: list[float] = []

    def learner() -> None:
        while limiter.wait_learner():
            time.sleep(learner_pause)
            limiter.learned_steps(limiter.steps_per_call)

    thread = threading.Thread(target=learner)
    thread.start()
    for _ in range(inserts):
        limiter.insert(1)
        assert limiter.wait_actor()
        gaps.append(limiter.learned - limiter.target())
        time.sleep(actor_pause)
    limiter.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return gaps


@pytest.mark.parametrize(("actor_pause", "learner_pause"), [(0.0, 0.002), (0.001, 0.0)],
                         ids=["slow-learner", "slow-actor"])
def test_limiter_holds_the_ratio_within_its_slack(actor_pause: float, learner_pause: float) -> None:
    limiter = RatioLimiter(8, 32, learning_starts=100, steps_per_call=4)
    gaps = _run(limiter, 1500, actor_pause, learner_pause)
    assert min(gaps) >= -limiter.slack - 1e-9, "the actor ran on while the learner was too far behind"
    assert max(gaps) <= limiter.slack + 1e-9, "the learner ran ahead of the data"
    assert limiter.learned == pytest.approx(limiter.target(), abs=limiter.slack + limiter.steps_per_call)
    assert limiter.learned > 0


def test_closing_releases_both_sides() -> None:
    limiter = RatioLimiter(8, 32, learning_starts=0, steps_per_call=1, slack=2)
    limiter.insert(100)  # the learner is 25 steps behind: the actor must wait
    results: list[bool] = []
    actor = threading.Thread(target=lambda: results.append(limiter.wait_actor()))
    actor.start()
    time.sleep(0.2)
    assert actor.is_alive()
    limiter.close()
    actor.join(timeout=5)
    assert results == [False]
    idle = RatioLimiter(8, 32, learning_starts=1000, steps_per_call=1)  # no data yet: the learner waits
    learner = threading.Thread(target=lambda: results.append(idle.wait_learner()))
    learner.start()
    time.sleep(0.2)
    assert learner.is_alive()
    idle.close()
    learner.join(timeout=5)
    assert results == [False, False]


DECOUPLED = [*CARTPOLE, "--replay-ratio", "auto"]  # the default: batch 16 / train frequency 2 = 8
SLACK = 16  # the limiter's slack: two learner calls of 8 steps (TensorFlow's default --steps-per-call)


def test_decoupled_run_holds_the_ratio_and_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _train_here(capsys, *DECOUPLED, "--total-timesteps", "1500", "--run-dir", str(run))  # (in this process)
    _, state = checkpoint.load(run)
    target = (1500 - 200) * 8 / 16
    assert abs(state["train_steps"] - target) <= SLACK
    scalars = _scalars(run)
    for tag in ("replay/inserted", "replay/sampled", "replay/ratio", "replay/sample_age", "charts/learner_steps_per_s",
                "replay/learner_wait_s", "replay/actor_wait_s"):
        assert tag in scalars, tag
    assert abs(scalars["replay/ratio"][-1] - 8) < 1.0
    assert all(np.isfinite(scalars["losses/td_loss"])) and min(scalars["replay/sample_age"]) >= 0


@pytest.mark.slow  # ~38 s: a decoupled run stopped by SIGTERM and resumed (the default run keeps test_decoupled_run_holds_the_ratio_and_reports_it, and test_trainer_smoke's SIGTERM checkpoint)
def test_decoupled_run_stops_on_sigterm_and_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(run, "--replay-ratio", "8", "--checkpoint-frequency", "400")
    _wait_for_checkpoint(run, proc, 800)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    _, state = checkpoint.load(run)
    s = state["global_step"]
    assert abs(state["train_steps"] - (s - 200) * 8 / 16) <= SLACK
    backend = "jax" if importlib.util.find_spec("jax") else "tensorflow"  # resumed on the other backend
    more = subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", "--resume", str(run), "--total-timesteps", str(s + 400),
                           "--steps-per-call", "4"], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend})
    assert more.returncode == 0, more.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["global_step"] == s + 400 and abs(state["train_steps"] - (s + 400 - 200) * 8 / 16) <= SLACK


def test_an_environment_that_dies_stops_the_learner_and_keeps_the_store(tmp_path: Path) -> None:
    """The acting side fails mid-run (the env raises) while the learner thread is busy: the process
    ends with the error, does not hang on the learner, and the store keeps what was committed."""
    run = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CRASH_AFTER": "700",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    argv = [a if a != "CartPole-v1" else "crashing_env:CrashingCartPole-v0" for a in DECOUPLED]
    done = subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv, "--total-timesteps", "5000", "--run-dir",
                           str(run)], capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode != 0 and "the environment died at step 701" in done.stderr, done.stderr[-3000:]
    with ReplayStore.open(run / "replay.zarr") as store:
        assert 0 < len(store) <= 700
