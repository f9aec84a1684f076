"""``replaystore-train --actors N``: Ray actor processes (a local Ray) act into their own streams of
the run's store while the trainer's process learns from it; an actor process that dies is restarted
on its streams and nothing it committed is lost; the run resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_trainer_smoke import CARTPOLE, _gradient_steps, _start, _wait_for_checkpoint

from replaystore import ReplayStore, StoreLockedError
from replaystore.cli import main as cli_main
from replaystore.trainer import checkpoint

pytest.importorskip("ray")

ACTORS = [*CARTPOLE, "--replay-ratio", "auto", "--actors", "2"]  # batch 16 / train frequency 2: ratio 8
#: The gradient steps may run the limiter's slack (two calls of 8) plus what the actors report late
#: (their sync interval) away from the replay ratio's count.
TOLERANCE = 16 + 2 * 50 * 8 // 16


def _run(*argv: str, env: dict[str, str] | None = None, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv], capture_output=True, text=True, check=False,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})


@pytest.mark.slow  # ~80 s: Ray, SeaweedFS and three actors that die (the default run keeps test_an_actor_that_keeps_dying_ends_the_run)
def test_actors_on_object_storage_die_and_are_restarted_on_their_streams(tmp_path: Path, s3_url: str) -> None:
    """Three actors write three streams of a store on the S3 server (--store URL) while the learner
    samples and refreshes. Each actor's environment ends its whole process after 400 of its steps (as
    a SIGKILL would): the trainer restarts it on the same streams once the dead actor's lease has
    expired, the new actor closes the unfinished episode as truncated and keeps every transition
    committed; the run completes and every stream verifies."""
    run = tmp_path / "run"
    argv = [a if a != "CartPole-v1" else "crashing_env:CrashingCartPole-v0" for a in ACTORS]
    env = {"CRASH_AFTER": "400", "CRASH_MODE": "exit",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    # (--dueling: the actors build the run's network, the learner's weights go into it)
    done = _run(*argv, "--actors", "3", "--store", s3_url, "--lease-ttl", "3", "--total-timesteps", "1500",
                "--dueling", "--run-dir", str(run), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "actor 0 (streams [0]) died" in done.stdout and "restarting it (restart 1 of at most 3)" in done.stdout
    assert not (run / "replay.zarr").exists()
    assert cli_main(["verify", s3_url, "--quiet"]) == 0
    with ReplayStore.open(s3_url) as store:
        assert store.num_streams == 3 and len(store) >= 1000
        # every actor acted; a stream may hold fewer than its actor's 400 steps before the crash (what
        # it had not committed yet died with it), and the run may end before its restart adds more
        assert all(st.added > 0 for st in store.stream_states())
        truncated = sum(int(r.truncated[: r.n_valid].sum()) for r in store.rings.streams)
        assert truncated >= 1  # the episodes the dead actors left unfinished


def test_an_actor_that_keeps_dying_ends_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = [a if a != "CartPole-v1" else "crashing_env:CrashingCartPole-v0" for a in ACTORS] + ["--actors", "1", "--actor-restarts", "1"]
    env = {"CRASH_AFTER": "5", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = _run(*argv, "--total-timesteps", "1500", "--run-dir", str(run), env=env)
    assert done.returncode == 1
    assert "died 2 times; the last: RuntimeError: the environment died at step 6" in done.stderr, done.stderr[-3000:]
    assert cli_main(["verify", str(run / "replay.zarr"), "--quiet"]) == 0


@pytest.mark.slow  # ~95 s: Ray started three times
def test_actors_survive_a_killed_learner_and_a_sigterm_and_resume(tmp_path: Path) -> None:
    """Two actors write a stream each while the learner learns. SIGKILL of the trainer's process (its
    Ray and actors go with it): --resume reopens every stream (the actors' unfinished episodes closed
    as truncated) and goes on. SIGTERM of that resumed run stops the actors (which commit),
    checkpoints and exits 143; a second --resume completes the run at the replay ratio. The actors
    make their envs with the run's --env-kwargs (CartPole cut at 15 moves, where most random games
    last longer), also when restarted by a resume."""
    run = tmp_path / "run"
    proc = _start(run, "--replay-ratio", "auto", "--actors", "2", "--checkpoint-frequency", "400",
                  "--env-kwargs", '{"max_episode_steps": 15}')
    try:
        _wait_for_checkpoint(run, proc, 800)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    _, state = checkpoint.load(run)
    s = state["global_step"]
    _wait_for_writers_to_go(run / "replay.zarr")

    proc = subprocess.Popen([sys.executable, "-m", "replaystore.trainer.cli", "--resume", str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    _wait_for_checkpoint(run, proc, s + 400)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert f"resuming {run} at step {s:,}" in out and "stopped by SIGTERM" in out
    _, state = checkpoint.load(run)
    s = state["global_step"]
    assert state["resumes"] == 1
    assert cli_main(["verify", str(run / "replay.zarr"), "--quiet"]) == 0

    more = _run("--resume", str(run), "--total-timesteps", str(s + 500))
    assert more.returncode == 0, more.stderr[-3000:]
    _, state = checkpoint.load(run)
    steps = state["global_step"]
    assert s + 500 <= steps <= s + 500 + 2 * 50 and state["resumes"] == 2
    assert abs(_gradient_steps(run) - (steps - 200) * 8 / 16) <= TOLERANCE
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.num_streams == 2 and all(r.n_valid > 200 for r in store.rings.streams)
        lengths = [len(e.reward) for e in store.iter_episodes(whole=True)]
    assert max(lengths) == 15 and lengths.count(15) >= 20, lengths  # (84 of 190 games, measured)
    assert cli_main(["verify", str(run / "replay.zarr"), "--quiet"]) == 0


def _wait_for_writers_to_go(path: Path, timeout: float = 60) -> None:
    """Ray ends a killed driver's actor processes within seconds; until then they hold their
    streams' writer locks (a resume then says so and can be retried)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ReplayStore.open(path, mode="a").close()
            return
        except StoreLockedError:
            assert time.monotonic() < deadline, "the killed run's actors still hold their streams"
            time.sleep(0.5)
