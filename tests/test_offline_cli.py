"""``replaystore-train --offline STORE``: ``fit_offline`` from the command line, in a run directory.

The CartPole dataset of test_offline.py (a noisy heuristic's moves, mean return ~150) is learned
from with CQL to a score above 400; the run directory holds the checkpoint, TensorBoard's scalars
and the evaluations but no store, and the dataset's files are byte for byte the same afterwards. A
run stopped by SIGTERM checkpoints and says how to go on; one killed with SIGKILL resumes from its
last checkpoint; both go on to a larger ``--gradient-steps`` and a finished run changes nothing. A
store at an ``s3://`` URL is learned from and kept as a URL. Flags of acting, a missing or too small
store, and an evaluation env unlike the store are refused in one line, before a run directory is
made. ``--init-from`` starts an online run from the offline agent's weights.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import snapshot

from replaystore import ReplayStore
from replaystore.cli import main as cli_main
from replaystore.trainer import TrainerError, checkpoint, load_run
from replaystore.trainer.cli import main
from replaystore.trainer.scalars import read as read_scalars

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from bench_offline import write_dataset  # noqa: E402  (the datasets the benchmark learns from)

#: test_offline.py's settings for CartPole, as flags
FLAGS = ["--batch-size", "64", "--train-frequency", "1", "--target-network-frequency", "500", "--learning-rate", "1e-3",
         "--sample-threads", "1", "--hidden-sizes", "64,64", "--no-progress"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    path = tmp_path_factory.mktemp("offline") / "cartpole.zarr"
    return path, write_dataset(path, 10_000, 0.5, seed=0)


def scalars(run: Path) -> dict[str, list[float]]:
    tags: dict[str, list[float]] = {}
    for record in read_scalars(run):
        for tag, value in record.items():
            if tag not in ("step", "time"):
                tags.setdefault(tag, []).append(value)
    return tags


@pytest.mark.slow  # ~9 s of learning; the default run learns offline through the API (test_offline.py) and resumes --offline
def test_cql_learns_offline_from_the_command_line(dataset: tuple[Path, float], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path, data_return = dataset
    before = snapshot(path)
    run = tmp_path / "run"
    code = main(["--offline", str(path), "--gradient-steps", "2000", "--cql-alpha", "1", *FLAGS, "--env-id",
                 "CartPole-v1", "--eval-episodes", "10", "--eval-frequency", "1000", "--run-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 0, out
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [1000, 2000] and len(evals[-1]["returns"]) == 10
    assert data_return < 200 and evals[-1]["mean_return"] >= 400
    assert "done: 2,000 gradient steps on" in out and "eval at gradient step 2,000" in out
    assert sorted(p.name for p in run.iterdir()) == ["args.json", "best.npz", "checkpoint.npz", "evals.jsonl", "scalars.jsonl",
                                                     "tb"]
    tags = scalars(run)
    assert {"losses/td_loss", "charts/SPS", "charts/learner_steps_per_s", "replay/size", "eval/mean_return"} <= set(tags)
    with ReplayStore.open(path) as store:
        assert "charts/epsilon" not in tags and tags["replay/size"][-1] == len(store)
    saved = json.loads((run / "args.json").read_text())
    assert saved["offline"] == str(path.resolve()) and saved["cql_alpha"] == 1.0
    assert cli_main(["episodes", str(run)]) == 0  # the run directory names the dataset it learned from
    assert f"its store is {path.resolve()}" in capsys.readouterr().err
    agent = load_run(run)  # the run's agent in Python: its dataset read, never fit into
    assert agent.train_steps == 2000 and agent.store is not None and agent.store.path == path.resolve()
    assert sum(agent.evaluate(gym.make("CartPole-v1"), 5)) / 5 >= 400
    with pytest.raises(TrainerError, match="learned offline from"):
        agent.fit(gym.make("CartPole-v1"), 300)
    agent.close()
    assert snapshot(path) == before


def _start(path: Path, run: Path, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, "-m", "replaystore.trainer.cli", "--offline", str(path), *FLAGS,
                             "--gradient-steps", "10000000", *argv, "--run-dir", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _learned(run: Path, proc: subprocess.Popen, least: int) -> int:
    """Wait until the run has checkpointed at least ``least`` gradient steps; returns its count."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            saved = checkpoint.load(run)
        except Exception:  # noqa: BLE001 - not there yet, or being replaced right now
            saved = None
        if saved is not None and saved[1]["train_steps"] >= least:
            return int(saved[1]["train_steps"])
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint at {least} gradient steps within 180 s")


def _resumes(run: Path, start: int, capsys: pytest.CaptureFixture[str]) -> None:
    """``--resume`` goes on from gradient step ``start`` to 320 more; a plain one then has nothing to do."""
    capsys.readouterr()  # (the resumes in this process, on its TensorFlow: the run learned on JAX)
    assert main(["--resume", str(run), "--gradient-steps", str(start + 320)]) == 0
    out = capsys.readouterr().out
    assert f"resuming {run} at gradient step {start:,}" in out and f"done: {start + 320:,} gradient steps" in out
    assert int(checkpoint.load(run)[1]["train_steps"]) == start + 320
    assert main(["--resume", str(run)]) == 0
    assert "nothing to do: the run already took its" in capsys.readouterr().out
    assert int(checkpoint.load(run)[1]["train_steps"]) == start + 320


def test_a_killed_offline_run_resumes_from_its_checkpoint(dataset: tuple[Path, float], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = dataset
    before = snapshot(path)
    killed = tmp_path / "killed"
    proc = _start(path, killed, "--checkpoint-frequency", "256")
    at = _learned(killed, proc, 512)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    at = max(at, int(checkpoint.load(killed)[1]["train_steps"]))  # (a later one may have landed)
    _resumes(killed, at, capsys)
    assert snapshot(path) == before


@pytest.mark.slow  # ~25 s; the default run stops online runs with SIGTERM (test_trainer_smoke.py, test_ratio.py)
def test_a_stopped_offline_run_resumes_from_its_checkpoint(dataset: tuple[Path, float], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = dataset
    before = snapshot(path)
    stopped = tmp_path / "stopped"
    proc = _start(path, stopped, "--checkpoint-frequency", "100000")
    _learned(stopped, proc, 0)  # the first checkpoint: the networks exist and learning is under way
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    steps = int(checkpoint.load(stopped)[1]["train_steps"])
    assert steps > 0 and f"stopped by SIGTERM at gradient step {steps:,}: checkpoint saved" in out
    assert f"replaystore-train --resume {stopped}" in out
    _resumes(stopped, steps, capsys)
    assert snapshot(path) == before


@pytest.mark.parametrize(("argv", "message"), [
    (["--num-envs", "4", "--learning-starts", "5"], "--learning-starts, --num-envs cannot be given with --offline"),
    (["--total-timesteps", "5"], "--total-timesteps cannot be given with --offline"),
    (["--eval-episodes", "3"], "--offline with --eval-episodes needs --env-id"),
    (["--gradient-steps", "0"], "--gradient-steps is 0; it must be a positive integer"),
    (["--cql-alpha", "-1"], "--cql-alpha is -1.0"),
    (["--env-id", "ALE/Pong-v5", "--eval-episodes", "2"], r"the evaluation env gives frames of Box\(0, 255, \(84, 84\)"),
    (["--batch-size", "20000"], r"holds \d+ transitions; a batch of 20000 with 3-step returns needs at least 20003"),
])
def test_bad_offline_flags_are_refused_before_a_run_directory_is_made(dataset: tuple[Path, float], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      argv: list[str], message: str) -> None:
    path, _ = dataset
    run = tmp_path / "run"
    assert main(["--offline", str(path), *argv, "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not run.exists()


def test_the_gradient_steps_of_an_online_run_and_a_missing_store_are_refused(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--env-id", "CartPole-v1", "--gradient-steps", "5", "--run-dir", str(tmp_path / "a")]) == 1
    assert "--gradient-steps counts the gradient steps of an --offline run" in capsys.readouterr().err
    assert main(["--offline", str(tmp_path / "none.zarr"), "--run-dir", str(tmp_path / "b")]) == 1
    assert "none.zarr holds no replay store; learning offline needs an existing one" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_dataset_on_object_storage_is_learned_from_and_kept_as_a_url(s3_url: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    write_dataset(s3_url, 2000, 0.5, seed=2)
    run = tmp_path / "run"
    assert main(["--offline", s3_url, "--gradient-steps", "32", *FLAGS, "--run-dir", str(run)]) == 0
    assert f"done: 32 gradient steps on {s3_url}" in capsys.readouterr().out
    assert json.loads((run / "args.json").read_text())["offline"] == s3_url
    assert main(["--resume", str(run), "--gradient-steps", "64"]) == 0
    assert int(checkpoint.load(run)[1]["train_steps"]) == 64


def test_an_agent_pretrained_offline_starts_an_online_run(dataset: tuple[Path, float], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--init-from`` takes the offline run's weights (not its optimizer or counters): the online
    run's first evaluation, before its first gradient step, plays as well as the offline agent."""
    path, data_return = dataset
    offline, online = tmp_path / "offline", tmp_path / "online"
    assert main(["--offline", str(path), "--gradient-steps", "2000", "--cql-alpha", "1", *FLAGS, "--run-dir",
                 str(offline)]) == 0
    argv = ["--env-id", "CartPole-v1", "--total-timesteps", "600", "--learning-starts", "500", "--buffer-size", "2000",
            "--hidden-sizes", "64,64", "--eval-episodes", "5", "--eval-frequency", "250", "--no-progress"]
    for bad, message in ((str(tmp_path / "none"), "holds no checkpoint.npz"),
                         (str(offline), "its weights do not fit this run's Q-network")):
        hidden = ["--hidden-sizes", "32"] if bad == str(offline) else []
        assert main([*argv, *hidden, "--init-from", bad, "--run-dir", str(tmp_path / "bad")]) == 1
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    assert main([*argv, "--init-from", str(offline), "--run-dir", str(online)]) == 0
    first = json.loads((online / "evals.jsonl").read_text().splitlines()[0])
    assert first["step"] == 250 and first["mean_return"] >= 400 > 2 * data_return  # no gradient step yet
    state = checkpoint.load(online)[1]
    assert state["global_step"] == 600 and 0 < state["train_steps"] < 100  # counted from 0, not from 2,000
