"""A run directory is data, never code: an ``args.json`` that names a module to import (``model``,
or an ``env_id`` of the form ``module:Name``) makes ``--resume``, ``--evaluate`` and ``load_run``
refuse in one line, importing nothing, until the user's own command line (or call) names it again.
The module here writes a sentinel file when imported: it must never appear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.trainer import TrainerError, load_run
from replaystore.trainer.cli import main

CARTPOLE = ["--env-id", "CartPole-v1", "--buffer-size", "2000", "--batch-size", "16", "--learning-starts", "100",
            "--train-frequency", "2", "--target-network-frequency", "100", "--no-progress", "--sample-threads", "1",
            "--total-timesteps", "300"]


@pytest.fixture()
def evil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``evil`` on the path whose import writes ``sentinel``; returns the sentinel's path."""
    sentinel = tmp_path / "sentinel"
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n"
                                    "def build(*args):\n    raise SystemExit('ran')\n")
    monkeypatch.syspath_prepend(str(folder))
    return sentinel


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--eval-episodes", "1", "--run-dir", str(run)]) == 0
    return run


def _name(run: Path, **fields: str) -> None:
    path = run / "args.json"
    saved = json.loads(path.read_text())
    saved.update(fields)
    path.write_text(json.dumps(saved))


@pytest.mark.parametrize(("field", "value", "flag"), [("model", "evil:build", "--model"),
                                                      ("env_id", "evil:Evil-v0", "--env-id")], ids=["model", "env-id"])
def test_a_run_directory_that_names_code_is_refused_and_nothing_is_imported(
        run: Path, evil: Path, field: str, value: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    _name(run, **{field: value})
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    for argv in (["--resume", str(run), "--total-timesteps", "400"], ["--evaluate", str(run)],
                 ["--evaluate", str(run), "--best"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert f"names {flag} {value}, code to import" in err and f"give {flag} {value} on the command line" in err
    with pytest.raises(TrainerError, match=f"names {flag} {value}, code to import") as caught:
        load_run(run)
    assert f"load_run(..., {field}={value!r})" in str(caught.value)
    assert not evil.exists() and "evil" not in sys.modules
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # (nothing written)


def test_the_users_own_command_line_names_it_again(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run of --env-id mod:Name evaluated on another env id: the recorded module is not imported."""
    _name(run, env_id="evil:Evil-v0")
    assert main(["--evaluate", str(run), "--env-id", "CartPole-v1", "--eval-episodes", "1"]) == 0
    assert "mean score" in capsys.readouterr().out
    agent = load_run(run, env_id="CartPole-v1")
    assert agent.state.global_step == 300
    agent.close()
    assert "evil" not in sys.modules


def test_a_resume_with_another_model_than_the_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*CARTPOLE, "--model", "user_models:layer_normed", "--run-dir", str(run)]) == 0
    assert main(["--resume", str(run), "--model", "user_models:batch_normed", "--total-timesteps", "400"]) == 1
    assert "give --model user_models:layer_normed on the command line" in capsys.readouterr().err


def test_a_fresh_process_refuses_too(run: Path, evil: Path) -> None:
    """In a child process (nothing imported before): the same refusal, the sentinel never written."""
    _name(run, model="evil:build")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(evil.parent / "code"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", "--evaluate", str(run)],
                          capture_output=True, text=True, check=False, timeout=120, env=env)
    assert done.returncode == 1 and "code to import" in done.stderr, done.stderr[-2000:]
    assert not evil.exists()
