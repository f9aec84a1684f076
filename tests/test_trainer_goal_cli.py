"""``replaystore-train`` on a goal env (Dict observations) with hindsight relabelling.

A ``module:Name-v0`` id registers the env (tests/goal_env.py's 8-bit flipping); the command line
learns it on two envs with ``--her-n-sampled-goal``, reports the evaluations' success rate,
keeps each move's ``is_success`` (``--info-keys``) for ``replaystore episodes``, resumes, is loaded back by ``load_run``, and learns offline from its own store with relabelling.
What cannot work (a Text entry, no goals, no ``compute_reward``, a module that cannot be imported,
hindsight settings) is refused in one line, before a run directory is made.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from goal_env import BitFlip, Rooms

from replaystore import ReplayStore
from replaystore.cli.episodes import list_episodes
from replaystore.trainer import TrainerError, load_run
from replaystore.trainer.cli import main
from replaystore.trainer.envs import make_env

BITS = ["--env-id", "goal_env:BitFlip-v0", "--buffer-size", "20000", "--learning-starts", "400", "--batch-size", "64",
        "--train-frequency", "1", "--target-network-frequency", "250", "--learning-rate", "0.001",
        "--exploration-fraction", "0.5", "--end-e", "0.05", "--hidden-sizes", "128,128", "--no-progress",
        "--sample-threads", "1", "--replay-ratio", "0"]


def _train(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """One ``replaystore-train`` in this process (tests/ is on its path, so ``goal_env`` imports);
    its output."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def _successes(agent: object, games: int) -> float:
    returns = agent.evaluate(BitFlip(8), games, seed=7)  # type: ignore[attr-defined]
    return float(np.mean(np.array(returns) > -8))  # (a game that ends before its 8th move reached its goal)


@pytest.mark.slow  # ~28 s of learning; the default run relabels and learns a goal through the API (test_trainer_nested.py)
def test_the_command_line_learns_bit_flipping_with_hindsight_resumes_and_learns_offline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "bits"
    _train(capsys, *BITS, "--her-n-sampled-goal", "4", "--num-envs", "2", "--total-timesteps", "3000",
           "--eval-episodes", "40", "--info-keys", "is_success:bool", "--run-dir", str(run))
    episodes = [e for s in (0, 1) for e in list_episodes(run / "replay.zarr", stream=s, newest=None)["episodes"]]
    reached = [e["extras_at_last_move"]["is_success"] for e in episodes if e["ended"] == "terminated"]
    assert reached and all(r is True for r in reached)  # (BitFlip ends a game when it reaches its goal)
    assert any(e["extras_at_last_move"]["is_success"] is False for e in episodes if e["ended"] == "truncated")
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    print("success rate", evals[-1]["success_rate"])
    assert evals[-1]["step"] in (3000, 3001) and evals[-1]["success_rate"] >= 0.8  # (an autoreset step is no move)
    with ReplayStore.open(run / "replay.zarr") as store:
        assert set(store.observation_space.spaces) == {"observation", "achieved_goal", "desired_goal"}
        assert store.num_streams == 2 and store.frame_stack == 1 and len(store) > 2900
    out = _train(capsys, "--resume", str(run), "--env-id", "goal_env:BitFlip-v0", "--total-timesteps", "3200")
    assert "resuming" in out and re.search("done: 3,20[01] steps", out)  # (the env's module named again: it is code)
    agent = load_run(run, env_id="goal_env:BitFlip-v0")  # dict_mlp with the checkpoint's weights
    assert agent.model.name == "online" and _successes(agent, 40) >= 0.8
    agent.close()

    offline = tmp_path / "offline"
    out = _train(capsys, "--offline", str(run / "replay.zarr"), "--env-id", "goal_env:BitFlip-v0",
                 "--her-n-sampled-goal", "4", "--gradient-steps", "320", "--batch-size", "64", "--hidden-sizes",
                 "128,128", "--no-progress", "--run-dir", str(offline))
    assert "done: 320 gradient steps" in out  # (blocks of 8 on TensorFlow)


@pytest.fixture
def registered() -> object:
    """Envs that cannot be learned as asked: a Text entry, and goals without compute_reward."""
    texts = gym.spaces.Dict({**BitFlip(4).observation_space.spaces, "note": gym.spaces.Text(8)})
    gym.register("TextBits-v0", entry_point=lambda: gym.wrappers.TransformObservation(
        BitFlip(4), lambda o: {**o, "note": "hi"}, texts))
    gym.register("GoalsNoReward-v0", entry_point=NoReward)
    gym.register("Rooms-v0", entry_point=Rooms)
    yield
    for name in ("TextBits-v0", "GoalsNoReward-v0", "Rooms-v0"):
        gym.registry.pop(name)


class NoReward(BitFlip):
    compute_reward = None  # type: ignore[assignment]

    def step(self, action):  # type: ignore[no-untyped-def]
        self.state[int(action)] = 1 - self.state[int(action)]
        self.t += 1
        reached = bool((self.state == self.goal).all())
        return self._obs(), -float(not reached), reached, self.t >= self.limit, {}


@pytest.mark.parametrize(("argv", "message"), [
    (["--env-id", "TextBits-v0"], "observation space Dict.*Text.*or Dicts and Tuples of them; wrap the env"),
    (["--env-id", "CartPole-v1", "--her-n-sampled-goal", "4"], "--her-n-sampled-goal is set, but the observations "
                                                               "are .*goal env's Dict observations.*--her-n-sampled-goal 0"),
    (["--env-id", "Rooms-v0", "--her-n-sampled-goal", "4"], "hindsight relabelling needs a goal env's Dict"),
    (["--env-id", "GoalsNoReward-v0", "--her-n-sampled-goal", "4"], "GoalsNoReward-v0 has no compute_reward"),
    (["--env-id", "no_such_module:Bits-v0"], "its module 'no_such_module' cannot be imported"),
    (["--env-id", "goal_env:BitFlip-v0", "--her-n-sampled-goal", "4", "--her-strategy", "later"],
     "--her-strategy is 'later'; it must be one of future, final, episode"),
    (["--env-id", "goal_env:BitFlip-v0", "--her-n-sampled-goal", "4", "--n-step", "3"], "--n-step is 3 with --her-n-sampled-goal 4.*use --n-step 1"),
    (["--offline", "some.zarr", "--her-n-sampled-goal", "4"], "--offline with --her-n-sampled-goal needs --env-id"),
], ids=["text", "not-a-dict", "no-goals", "no-compute-reward", "no-module", "strategy", "n-step", "offline-no-env"])
def test_what_cannot_work_is_refused_before_a_run_is_made(tmp_path: Path, registered: object, argv: list[str],
                                                         message: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*argv, "--run-dir", str(run), "--total-timesteps", "1000", "--learning-starts", "100"]
                if "--offline" not in argv else [*argv, "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert not run.exists()


def test_make_env_takes_a_goal_env_and_names_what_it_refuses() -> None:
    env = make_env("goal_env:BitFlip-v0")
    assert isinstance(env.observation_space, gym.spaces.Dict) and env.action_space.n == 8
    env.close()
    with pytest.raises(TrainerError, match="module 'nowhere' cannot be imported"):
        make_env("nowhere:Env-v0")
