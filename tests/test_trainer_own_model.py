"""``replaystore-train --model module:function``: the run's Q-network is the user's own, built by
``function(observation_space, n_actions, frame_stack)`` (tests/user_models.py), for the run, its
``--resume`` and ``load_run``. A function that cannot be imported or found, or a model DQN cannot
train, is refused in one line before the run directory is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.trainer import load_run
from replaystore.trainer.cli import main

CARTPOLE = ["--env-id", "CartPole-v1", "--buffer-size", "3000", "--batch-size", "16", "--learning-starts", "200",
            "--train-frequency", "2", "--target-network-frequency", "100", "--no-progress", "--sample-threads", "1"]


def test_a_run_learns_resumes_and_loads_with_the_users_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (tests/ is on its path, so ``user_models`` imports)."""
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--model", "user_models:layer_normed", "--total-timesteps", "1200", "--run-dir",
                 str(run)]) == 0
    assert json.loads((run / "args.json").read_text())["model"] == "user_models:layer_normed"
    assert main(["--resume", str(run), "--total-timesteps", "1600"]) == 0
    assert "done: 1,600 steps" in capsys.readouterr().out
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
