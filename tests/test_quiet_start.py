"""A quiet start: no TensorFlow, absl or XLA lines on stderr from ``import replaystore.trainer`` and
its names, on either Keras backend, on a machine without a GPU, unless the user raises the verbosity
(``TF_CPP_MIN_LOG_LEVEL`` set below 3: then TensorFlow prints what it prints)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOISE = ("cuInit", "absl::InitializeLog", "cuda drivers", "cpu_feature_guard", "oneDNN", "I0000", "E0000", "W0000")
PROGRAM = "from replaystore.trainer import DQN, mlp\nimport keras\nprint(keras.backend.backend())"


def _run(backend: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND=backend, **extra)
    return subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=False, timeout=120,
                          env=env)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_importing_the_trainer_prints_nothing_on_stderr(backend: str) -> None:
    done = _run(backend)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == backend
    assert done.stderr == "", done.stderr[-2000:]


def test_the_usual_quiet_setting_is_quiet_too() -> None:
    """``TF_CPP_MIN_LOG_LEVEL=3`` (what users set to quiet TensorFlow) lets absl's lines through on
    its own; the trainer's import filters them as when it is unset."""
    done = _run("tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]


def test_a_verbosity_the_user_set_shows_tensorflows_lines() -> None:
    done = _run("tensorflow", TF_CPP_MIN_LOG_LEVEL="0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(noise in done.stderr for noise in NOISE), done.stderr[-2000:]


def test_the_store_command_line_prints_nothing_on_stderr(tmp_path: object) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "replaystore.cli", "--help"], capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
