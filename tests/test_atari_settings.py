"""ALE settings through ``--env-kwargs`` (envs.ATARI_SETTINGS): sticky actions, the full action set,
the episode's frame limit, no-op starts and the frame skip reach the single env (AtariPreprocessing)
and ale-py's vector env (whole and in halves) alike, and a whole run plays the game they make."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replaystore import ReplayStore
from replaystore.trainer.config import TrainerError
from replaystore.trainer.envs import ATARI_SETTINGS, atari_settings, make_env, make_vector_env

#: No sticky actions and no no-op starts: Pong is then the same game under every seed.
FIXED = {"repeat_action_probability": 0.0, "noop_max": 0}


def _single_frames(kwargs: dict | None, seed: int, actions: np.ndarray) -> np.ndarray:
    env = make_env("ALE/Pong-v5", kwargs)
    frames = [env.reset(seed=seed)[0]]
    frames += [env.step(int(a))[0] for a in actions]
    env.close()
    return np.stack(frames)


def _vector_frames(kwargs: dict | None, seed: int, actions: np.ndarray, halves: bool) -> np.ndarray:
    """Env 0's frames (every env plays ``actions``); an int seed seeds the envs with consecutive values."""
    envs = make_vector_env("ALE/Pong-v5", 2, kwargs=kwargs, halves=halves)
    frames = [envs.reset(seed=seed)[0][0]]
    frames += [envs.step(np.full(2, a))[0][0] for a in actions]
    envs.close()
    return np.stack(frames)


@pytest.mark.parametrize("kind", ["single", "vector", "halves"])
def test_sticky_actions_and_no_op_starts_are_the_envs_randomness(kind: str) -> None:
    """With v5's settings two seeds play one sequence of moves differently (sticky actions, no-op
    starts); with ``{"repeat_action_probability": 0, "noop_max": 0}`` they play it identically."""
    actions = np.random.default_rng(0).integers(0, 6, size=150)

    def frames(kwargs: dict | None, seed: int) -> np.ndarray:
        if kind == "single":
            return _single_frames(kwargs, seed, actions)
        return _vector_frames(kwargs, seed, actions, halves=kind == "halves")

    assert not np.array_equal(frames(None, 1), frames(None, 2))
    assert np.array_equal(frames(FIXED, 1), frames(FIXED, 2))


def test_full_action_space_and_frame_limit_reach_both_kinds_of_env() -> None:
    """(Without no-op starts: the single env counts its no-op frames in the limit, ale-py's does not.)"""
    kwargs = {"full_action_space": True, "max_num_frames_per_episode": 400, "frameskip": 2, "noop_max": 0}
    env = make_env("ALE/Pong-v5", kwargs)
    assert env.action_space.n == 18
    env.reset(seed=0)
    moves = 1
    while not any(env.step(0)[2:4]):
        moves += 1
    assert moves == 200  # 400 frames, 2 a move
    envs = make_vector_env("ALE/Pong-v5", 2, kwargs=kwargs)
    assert envs.single_action_space.n == 18
    envs.reset(seed=0)
    for move in range(1, 201):
        _, _, terminated, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
        assert not terminated.any() and truncated.all() == (move == 200)
    envs.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": 1}, "does not take the keyword 'mode' (ale-py's vector env plays the default mode)"),
    ({"obs_type": "rgb"}, "does not take the keyword 'obs_type' (the preprocessing makes 84x84 gray frames)"),
    ({"sticky": 0.0}, "does not take the keyword 'sticky'; an ALE id takes repeat_action_probability, "
                      "full_action_space, max_num_frames_per_episode, noop_max, frameskip"),
    ({"repeat_action_probability": 1.5}, "repeat_action_probability is 1.5; give a probability from 0 to 1 "
                                         "(the default is 0.25)"),
    ({"full_action_space": 1}, "full_action_space is 1; give true or false (the default is false)"),
    ({"noop_max": -1}, "noop_max is -1; give a whole number >= 0 (the default is 30)"),
    ({"frameskip": 0}, "frameskip is 0; give a whole number >= 1 (the default is 4)"),
    ({"frameskip": 2.5}, "frameskip is 2.5; give a whole number >= 1"),
    ({"max_num_frames_per_episode": True}, "max_num_frames_per_episode is true; give a whole number >= 1"),
])
def test_settings_it_cannot_honour_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(TrainerError, match=None) as caught:
        atari_settings("ALE/Pong-v5", kwargs)
    assert str(caught.value).startswith("ALE/Pong-v5") and message in str(caught.value)
    with pytest.raises(TrainerError):
        make_vector_env("ALE/Pong-v5", 2, kwargs=kwargs)


def test_defaults_are_v5s() -> None:
    """The defaults are what ``gym.make("ALE/...-v5")`` registers, and the Nature DQN's preprocessing."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    registered = gym.spec("ALE/Pong-v5").kwargs
    assert atari_settings("ALE/Pong-v5", None) == ATARI_SETTINGS
    for key in ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode", "frameskip"):
        assert ATARI_SETTINGS[key] == registered[key]
    assert ATARI_SETTINGS["noop_max"] == 30


@pytest.mark.slow  # ~14 s: an ALE run; the default run checks what the kwargs make of the env (above)
def test_a_run_plays_the_game_its_env_kwargs_make(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Pong run on 2 envs with all 18 actions and games cut at 400 frames (100 moves): the
    Q-network has 18 outputs, the store holds moves of the full set, every whole episode is 100
    moves ending truncated, and the evaluation plays the same game; ``--resume`` keeps the settings."""
    from replaystore.trainer import load_run
    from replaystore.trainer.cli import main

    run = tmp_path / "run"
    settings = '{"full_action_space": true, "max_num_frames_per_episode": 400, "repeat_action_probability": 0}'
    flags = ["--env-id", "ALE/Pong-v5", "--env-kwargs", settings, "--num-envs", "2", "--buffer-size", "1000",
             "--batch-size", "8", "--learning-starts", "200", "--replay-ratio", "0", "--sample-threads", "1",
             "--eval-episodes", "2", "--no-progress", "--run-dir", str(run)]
    assert main([*flags, "--total-timesteps", "400"]) == 0, capsys.readouterr().err
    assert json.loads((run / "args.json").read_text())["env_kwargs"] == settings
    assert load_run(run).model.output_shape[-1] == 18
    with ReplayStore.open(run / "replay.zarr") as store:
        episodes = list(store.iter_episodes(whole=True))
        assert len(episodes) >= 2 and int(store.sample(300, rng=np.random.default_rng(0)).action.max()) > 5
    assert all(len(e.reward) == 100 and e.truncated[-1] and not e.terminated.any() for e in episodes)
    evaluation = json.loads((run / "evals.jsonl").read_text().splitlines()[-1])
    assert len(evaluation["returns"]) == 2
    assert main(["--resume", str(run), "--total-timesteps", "600"]) == 0, capsys.readouterr().err
    with ReplayStore.open(run / "replay.zarr") as store:
        assert all(len(e.reward) == 100 for e in store.iter_episodes(whole=True))
