"""The run's Q-network. ``replaystore-train --model module:function``: the user's own, built by
``function(observation_space, n_actions, frame_stack)`` (tests/user_models.py), for the run, its
``--resume`` and ``load_run`` (given the function again: a run directory never names code to run). A function that cannot be imported or found, or a model DQN cannot
train, is refused in one line before the run directory is made. ``--dueling``: the default network
with a dueling head, for every kind of observation, kept by ``--resume``, ``load_run`` and
``--evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.trainer import TrainerError, load_run
from replaystore.trainer.cli import main

CARTPOLE = ["--env-id", "CartPole-v1", "--buffer-size", "3000", "--batch-size", "16", "--learning-starts", "200",
            "--train-frequency", "2", "--target-network-frequency", "100", "--no-progress", "--sample-threads", "1"]


def test_a_run_learns_resumes_and_loads_with_the_users_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (tests/ is on its path, so ``user_models`` imports)."""
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--model", "user_models:layer_normed", "--total-timesteps", "1200", "--run-dir",
                 str(run)]) == 0
    assert json.loads((run / "args.json").read_text())["model"] == "user_models:layer_normed"
    assert main(["--resume", str(run), "--total-timesteps", "1600"]) == 1  # (args.json names code: given again)
    assert "give --model user_models:layer_normed on the command line yourself" in capsys.readouterr().err
    assert main(["--resume", str(run), "--model", "user_models:layer_normed", "--total-timesteps", "1600"]) == 0
    assert "done: 1,600 steps" in capsys.readouterr().out
    with pytest.raises(TrainerError, match="give load_run"):
        load_run(run)
    agent = load_run(run, model="user_models:layer_normed")
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


def test_dueling_runs_resumes_loads_and_plays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from replaystore.trainer import Dueling

    run = tmp_path / "run"
    assert main([*CARTPOLE, "--dueling", "--total-timesteps", "1200", "--run-dir", str(run)]) == 0
    assert json.loads((run / "args.json").read_text())["dueling"] is True
    assert main(["--resume", str(run), "--total-timesteps", "1600"]) == 0
    assert "done: 1,600 steps" in capsys.readouterr().out
    agent = load_run(run)
    head = agent.model.layers[-1]
    assert isinstance(head, Dueling) and head.name == "q_values" and agent.state.global_step == 1600
    agent.close()
    assert main(["--evaluate", str(run), "--eval-episodes", "2"]) == 0
    assert "mean" in capsys.readouterr().out


def test_dueling_heads_every_default_network() -> None:
    """The Nature CNN (images), the MLP (vectors), the embedding MLP (a Discrete) and dict_mlp (a Dict
    or Tuple) each end in the dueling head with --dueling, and in a Dense layer without."""
    import gymnasium as gym

    from replaystore.trainer import Dueling
    from replaystore.trainer.args import Args, q_network

    spaces = {"nature_cnn": (gym.spaces.Box(0, 255, (84, 84), "uint8"), 4),
              "mlp": (gym.spaces.Box(-1, 1, (4,), "float32"), 1),
              "embedded_mlp": (gym.spaces.Discrete(16), 1),
              "dict_mlp": (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (3,)), "b": gym.spaces.Discrete(5)}), 1)}
    for name, (space, frames) in spaces.items():
        for dueling in (True, False):
            model = q_network(Args(dueling=dueling), space, frames, 3)
            assert model.name == "online" and model.output_shape == (None, 3)
            assert isinstance(model.layers[-1], Dueling) is dueling, (name, dueling)
            built = {layer.name for layer in model.layers}
            assert name != "nature_cnn" or any(n.startswith("conv2d") for n in built)


def test_dueling_is_refused_with_an_own_model_on_resume_and_into_another_network(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--dueling", "--model", "user_models:layer_normed", "--total-timesteps", "1000",
                 "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert "--dueling asks for the default Q-network's dueling head, but --model user_models:layer_normed" in err
    assert err.count("\n") == 1 and not run.exists()
    assert main([*CARTPOLE, "--total-timesteps", "600", "--run-dir", str(run)]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    capsys.readouterr()
    assert main(["--resume", str(run), "--dueling"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--dueling" in err and err.count("\n") == 1, err
    # a dueling run started from a plain one's weights: they do not fit, and nothing is made
    assert main([*CARTPOLE, "--dueling", "--total-timesteps", "600", "--init-from", str(run), "--run-dir",
                 str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err
    assert "its weights do not fit this run's Q-network" in err and err.count("\n") == 1, err
    assert not (tmp_path / "other").exists()
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
