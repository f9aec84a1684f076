"""``replaystore-train --model module:function``: the run's Q-network is the user's own, built by
``function(observation_space, n_actions, frame_stack)`` (tests/user_models.py), for the run, its
``--resume`` and ``load_run``. A function that cannot be imported or found, or a model DQN cannot
train, is refused in one line before the run directory is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.trainer import load_run
from replaystore.trainer.cli import main

TESTS = str(Path(__file__).parent)
CARTPOLE = ["--env-id", "CartPole-v1", "--buffer-size", "3000", "--batch-size", "16", "--learning-starts", "200",
            "--train-frequency", "2", "--target-network-frequency", "100", "--no-progress", "--sample-threads", "1"]


def _train(*argv: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_a_run_learns_resumes_and_loads_with_the_users_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _train(*CARTPOLE, "--model", "user_models:layer_normed", "--total-timesteps", "1200", "--run-dir", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "args.json").read_text())["model"] == "user_models:layer_normed"
    done = _train("--resume", str(run), "--total-timesteps", "1600")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 1,600 steps" in done.stdout
    sys.path.insert(0, TESTS)  # (load_run imports it here too)
    agent = load_run(run)
    assert agent.model.name == "layer_normed" and agent.state.global_step == 1600
    assert "LayerNormalization" in [type(layer).__name__ for layer in agent.model.layers]
    assert agent.act([[0.0, 0.0, 0.0, 0.0]]) in (0, 1)
    agent.close()


@pytest.mark.parametrize(("model", "message"), [
    ("user_models", "--model is 'user_models'; give module:function"),
    ("no_such_module:build", "--model no_such_module:build: the module 'no_such_module' cannot be imported"),
    ("user_models:missing", "--model user_models:missing: user_models has no function 'missing'"),
    ("user_models:NOT_CALLABLE", "user_models has no function 'NOT_CALLABLE'"),
    ("user_models:not_a_model", "not_a_model(observation_space, n_actions, frame_stack) returned a str, not a "
                                "keras.Model"),
    ("user_models:one_output_too_many", "the model outputs shape (3,) per stack, but the environment has 2 actions"),
    ("user_models:batch_normed", "the model updates non-trainable state while training"),
], ids=["no-function", "no-module", "missing", "not-callable", "not-a-model", "outputs", "batch-norm"])
def test_a_model_that_cannot_work_is_refused_before_the_run_is_made(tmp_path: Path, model: str, message: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--model", model, "--total-timesteps", "1000", "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not run.exists()
