"""Whole ``replaystore-train`` runs in subprocesses, at tiny sizes: CartPole and a real ALE game,
SIGKILL mid-training then ``--resume``, SIGTERM saving a checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from replaystore import ReplayStore
from replaystore.cli import main as cli_main
from replaystore.trainer import checkpoint
from replaystore.trainer.config import linear_schedule
from replaystore.trainer.scalars import read as read_scalars

TAGS = {"charts/episodic_return", "charts/episodic_length", "charts/epsilon", "charts/SPS", "losses/td_loss",
        "losses/q_values", "replay/size", "replay/cache_hit_rate", "replay/sample_ms"}
CARTPOLE = ["--env-id", "CartPole-v1", "--buffer-size", "3000", "--batch-size", "16", "--learning-starts", "200",
            "--train-frequency", "2", "--target-network-frequency", "100", "--no-progress", "--sample-threads", "1",
            "--replay-ratio", "0"]  # lockstep: gradient steps counted exactly (test_ratio.py runs the decoupled default)


def _gradient_steps(run: Path) -> int:
    """Gradient steps taken plus those due (a learner takes them a block of --steps-per-call at a time)."""
    _, state = checkpoint.load(run)
    return state["train_steps"] + state.get("due_steps", 0)


def _train(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv], capture_output=True, text=True, check=False,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _train_here(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """A run in this process (its TensorFlow loaded once; runs that are signalled or killed start
    the command line instead): its standard output, after checking it ended well."""
    from replaystore.trainer.cli import main

    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def _scalars(run_dir: Path) -> dict[str, list[float]]:
    import tensorflow as tf

    out: dict[str, list[float]] = {}
    for path in (run_dir / "tb").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return out


def test_cartpole_run_writes_store_checkpoint_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    out = _train_here(capsys, *CARTPOLE, "--total-timesteps", "1200", "--run-dir", str(run), "--eval-episodes", "2")
    assert "done: 1,200 steps" in out and "eval at step 1,200" in out
    assert {p.name for p in run.iterdir()} == {"args.json", "replay.zarr", "checkpoint.npz", "tb", "evals.jsonl",
                                               "scalars.jsonl", "best.npz"}
    _, state = checkpoint.load(run)
    assert state["global_step"] == 1200 and _gradient_steps(run) == (1200 - 200) // 2
    scalars = _scalars(run)
    records = read_scalars(run)  # the same scalars as JSON lines
    assert {tag for r in records for tag in r} - {"step", "time"} == set(scalars)
    for tag, values in scalars.items():
        assert [r[tag] for r in records if tag in r] == pytest.approx(values, rel=1e-6)
    assert TAGS <= set(scalars), TAGS - set(scalars)
    assert all(np.isfinite(scalars["losses/td_loss"]))
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.added >= 1200 and len(store) == 1200 and store.frame_stack == 1
    assert cli_main(["inspect", str(run / "replay.zarr"), "--plot", str(tmp_path / "run.png")]) == 0
    assert "1,200" in capsys.readouterr().out and (tmp_path / "run.png").stat().st_size > 10_000
    assert cli_main(["verify", str(run / "replay.zarr"), "--quiet"]) == 0
    # The run directory itself names its store for the verbs that read; compact wants the store named
    assert cli_main(["inspect", str(run)]) == 0 and cli_main(["verify", str(run), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "1,200" in out and err.count(f"{run} is a replaystore-train run directory: its store is "
                                        f"{run / 'replay.zarr'}") == 2
    assert cli_main(["compact", str(run), "--quiet"]) == 1
    assert f"its store is {run / 'replay.zarr'}: pass that" in capsys.readouterr().err
    assert cli_main(["compact", str(run / "replay.zarr"), "--capacity", "1000", "--quiet"]) == 0
    assert "1,000 steps in" in capsys.readouterr().out


@pytest.mark.slow  # ~15 s; the default run trains the Nature CNN on Atari in test_num_envs_runs_on_atari_vector_env_and_resumes
def test_atari_run_learns_from_the_store(tmp_path: Path) -> None:
    run = tmp_path / "breakout"
    done = _train("--env-id", "ALE/Breakout-v5", "--total-timesteps", "500", "--buffer-size", "1000",
                  "--batch-size", "8", "--learning-starts", "100", "--target-network-frequency", "100",
                  "--run-dir", str(run), "--no-progress", "--sample-threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    scalars = _scalars(run)
    assert TAGS - {"charts/episodic_return", "charts/episodic_length"} <= set(scalars)
    assert all(np.isfinite(scalars["losses/td_loss"])) and all(np.isfinite(scalars["losses/q_values"]))
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.observation_space.shape == (84, 84) and store.frame_stack == 4
        batch = store.sample(4, rng=np.random.default_rng(0))
        assert batch.obs.shape == (4, 4, 84, 84) and set(np.unique(batch.reward)) <= {-1.0, 0.0, 1.0}


def _start(run: Path, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "replaystore.trainer.cli", *CARTPOLE, "--total-timesteps", "100000",
                             *argv, "--run-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, step: int) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if (run / checkpoint.CHECKPOINT).exists():
            try:
                _, state = checkpoint.load(run)
            except Exception:  # noqa: BLE001 - being replaced right now
                state = {"global_step": 0}
            if state["global_step"] >= step:
                return state
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint at step {step} within 180 s")


def test_sigkill_then_resume_continues_from_the_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The killed run is a process of its own; the resumes run in this one."""
    run = tmp_path / "run"
    proc = _start(run, "--checkpoint-frequency", "300")
    _wait_for_checkpoint(run, proc, 900)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    arrays, state = checkpoint.load(run)
    s = state["global_step"]
    with ReplayStore.open(run / "replay.zarr") as store:
        committed = store.committed.added
        assert committed >= state["stored"]
        rewards = store.ring.reward[:committed].copy()
        actions = store.ring.action[:committed].copy()

    # Resuming with nothing left to do: the checkpoint written back is the one loaded.
    assert f"resuming {run} at step {s:,}" in _train_here(capsys, "--resume", str(run), "--total-timesteps", str(s))
    again, state2 = checkpoint.load(run)
    for part in ("online", "target", "optimizer"):
        for a, b in zip(arrays[part], again[part], strict=True):
            np.testing.assert_array_equal(a, b)
    assert state2["global_step"] == s and state2["episodes"] == state["episodes"]

    # Resuming for 300 more steps: step, epsilon, gradient steps and the store carry on.
    _train_here(capsys, "--resume", str(run), "--total-timesteps", str(s + 300))
    _, state3 = checkpoint.load(run)
    assert state3["global_step"] == s + 300
    assert state3["train_steps"] + state3["due_steps"] == state["train_steps"] + state["due_steps"] + 150
    assert state3["epsilon"] == pytest.approx(linear_schedule(1.0, 0.02, 0.1 * (s + 300), s + 299))
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.added >= committed + 300
        np.testing.assert_array_equal(store.ring.action[:committed], actions)
        np.testing.assert_array_equal(store.ring.reward[:committed], rewards)
        assert store.ring.is_last[committed - 1]  # the episode left unfinished by the kill was closed


def test_sigterm_saves_a_checkpoint_and_flushes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(run, "--checkpoint-frequency", "500")
    _wait_for_checkpoint(run, proc, 500)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in out and f"--resume {run}" in out
    _, state = checkpoint.load(run)
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.committed.added == store.added and len(store) == state["stored"] == state["global_step"]
    assert json.loads((run / "args.json").read_text())["env_id"] == "CartPole-v1"


def test_resume_before_the_first_checkpoint_starts_over_and_keeps_the_store(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _train_here(capsys, *CARTPOLE, "--total-timesteps", "300", "--run-dir", str(run))
    (run / checkpoint.CHECKPOINT).unlink()  # as if killed while TensorFlow was still loading
    with ReplayStore.open(run / "replay.zarr") as store:
        before = store.added
    assert f"resuming {run} at step 0" in _train_here(capsys, "--resume", str(run), "--total-timesteps", "300")
    _, state = checkpoint.load(run)
    assert state["global_step"] == 300
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.added >= before + 300


def test_prioritized_n_step_run_with_the_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    argv = [a for a in CARTPOLE if a != "--no-progress"]
    out = _train_here(capsys, *argv, "--total-timesteps", "700", "--prioritized", "--n-step", "3", "--run-dir", str(run))
    assert "done: 700 steps" in out and "train" in out  # rich's bar, rendered once off a terminal
    with ReplayStore.open(run / "replay.zarr") as store:
        live = np.flatnonzero(store.ring.valid)
        priorities = store.priorities(live)
        # the learner sent |td| + eps back for the transitions it trained on: not all at the initial 1.0
        assert np.unique(priorities).size > 10 and priorities.min() < 1.0


def test_num_envs_runs_on_atari_vector_env_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--num-envs 3 on a real ALE game: ale-py's AtariVectorEnv in two halves stepped in turn
    (--overlap-envs on), one stream per env, the replay ratio of one env (a gradient step per
    train_frequency env steps), and --resume."""
    run = tmp_path / "run"
    flags = ["--env-id", "ALE/Breakout-v5", "--num-envs", "3", "--overlap-envs", "on", "--buffer-size", "3000", "--batch-size", "8",
             "--learning-starts", "300", "--train-frequency", "4", "--no-progress", "--sample-threads", "1",
             "--checkpoint-frequency", "300", "--replay-ratio", "0", "--run-dir", str(run)]
    _train_here(capsys, *flags, "--total-timesteps", "600")
    _, state = checkpoint.load(run)
    steps = state["global_step"]
    assert 600 <= steps < 603 and _gradient_steps(run) == steps // 4 - 300 // 4 and state["episodes"] >= 0
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.num_streams == 3 and len(store) == steps
        assert all(r.n_valid > 150 for r in store.rings.streams)
    _train_here(capsys, "--resume", str(run), "--total-timesteps", "800")
    with ReplayStore.open(run / "replay.zarr") as store:
        assert len(store) >= 800 and store.committed.added >= 800
    assert cli_main(["verify", str(run / "replay.zarr"), "--quiet"]) == 0


def test_what_a_newcomer_meets_resume_records_its_steps_and_output_is_plain(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Without a terminal: plain log lines, not cut; no TensorFlow start-up noise (the user's
    TF_CPP_MIN_LOG_LEVEL unset); --resume --total-timesteps N is recorded, so a later plain --resume
    goes on to N and then says there is nothing to do, leaving the store and the checkpoint alone."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}

    def train(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv], capture_output=True, text=True,
                              check=False, timeout=240, env=env)

    first = train(*[a for a in CARTPOLE if a != "--no-progress"], "--total-timesteps", "300", "--run-dir", str(run))
    assert first.returncode == 0, first.stderr[-3000:]
    for noise in ("cuInit", "absl::InitializeLog", "cuda drivers", "cpu_feature_guard", "oneDNN"):
        assert noise not in first.stderr, first.stderr[-3000:]
    lines = [x for x in first.stdout.splitlines() if x.startswith("train ")]
    assert re.fullmatch(r"train 300/300  \d+ SPS  score [\d.]+  eps 0\.020  replay 300  loss [\d.]+  Q -?[\d.]+",
                        lines[-1]), first.stdout  # the whole line, however wide, and one at the end
    _train_here(capsys, "--resume", str(run), "--total-timesteps", "400")  # (the resumes in this process)
    assert json.loads((run / "args.json").read_text())["total_timesteps"] == 400
    _, state = checkpoint.load(run)
    assert state["global_step"] == 400
    with ReplayStore.open(run / "replay.zarr") as store:
        added, ends = store.added, store.ring.is_last[: store.added].copy()
    events = sorted(p.name for p in (run / "tb").iterdir())
    assert "nothing to do: the run already took its 400 steps" in _train_here(capsys, "--resume", str(run))
    _, state2 = checkpoint.load(run)
    assert state2 == state and sorted(p.name for p in (run / "tb").iterdir()) == events
    with ReplayStore.open(run / "replay.zarr") as store:  # no episode closed, nothing added
        assert store.added == added and np.array_equal(store.ring.is_last[:added], ends)
