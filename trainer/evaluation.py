"""Evaluation: whole games (all lives, raw rewards) played greedily, or with ``epsilon``-random
moves, by a learner on a gymnasium env or a vector env (``DQN.evaluate``), on one path: one env is
played as a vector of one (gymnasium's ``SyncVectorEnv`` over it). On a vector env each env
plays its share of the games, so that short games are not over-counted. A goal env's games also say
whether they reached their goal (``info["is_success"]`` at a game's last step, as gymnasium-robotics
and SB3's goal envs report it): ``Played.successes``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from .actions import ActionSpec
from .config import TrainerError, check_count
from .envs import env_spaces, vector_frames
from .explore import epsilon_greedy, lives_in, lost_life
from .learnerbase import Learner
from .stacks import StackSpec, push_frames, stacks_of
from .stores import check_for_network


@dataclass
class Played:
    """Games played: each one's raw return, and (where the env reports ``is_success`` at a game's
    end) whether it reached its goal."""

    returns: list[float] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)


def play(env: Any, learner: Learner, stacks: StackSpec, actions: ActionSpec, episodes: int, *, epsilon: float, seed: int,
         life_loss: bool, on_game: Callable[[float], None] | None = None) -> Played:
    """``episodes`` games on ``env`` (a gymnasium env or a vector env), checked
    first: an env whose frames or actions the Q-network cannot take, no games, or an ``epsilon``
    outside [0, 1] is a TrainerError. ``on_game`` gets each game's return as the game ends."""
    check_for_network(*env_spaces(env), stacks, actions)
    check_count("episodes", episodes, least=1)
    if not 0.0 <= epsilon <= 1.0:
        raise TrainerError(f"epsilon is {epsilon!r}; it must be in [0, 1]")
    rng = np.random.default_rng(seed)
    if hasattr(env, "num_envs"):
        return evaluate_vector(env, learner, episodes, epsilon, rng, stacks, life_loss, on_game)
    one = gym.vector.SyncVectorEnv([lambda: env])  # one env played as a vector of one (not closed: it is the caller's)
    return evaluate_vector(one, learner, episodes, epsilon, rng, stacks, life_loss, on_game)


def evaluate_vector(envs: Any, learner: Learner, episodes: int, epsilon: float, rng: np.random.Generator,
                    stacks: StackSpec, life_loss: bool, on_game: Callable[[float], None] | None = None) -> Played:
    obs, info = envs.reset(seed=int(rng.integers(2**31)))
    batch = stacks_of(vector_frames(obs), stacks.frame_stack)
    n = int(envs.num_envs)
    # each env plays its share of the games, so that short games are not over-counted (taking the
    # first `episodes` to end would favour them)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    counts = np.zeros(n, dtype=np.int64)
    totals, out = np.zeros(n), Played()
    resetting = np.zeros(n, dtype=bool)
    lives = lives_in(info)
    while len(out.returns) < episodes:
        moves = epsilon_greedy(learner.act_batch, batch, n, learner.actions, epsilon, rng)
        obs, reward, terminated, truncated, info = envs.step(moves)
        frames = vector_frames(obs)
        totals += np.where(resetting, 0.0, reward)
        done = terminated | truncated
        success = _reported(info, "is_success", n)
        for i in np.flatnonzero(done & ~resetting):
            if counts[i] < quota[i]:
                out.returns.append(float(totals[i]))
                if success is not None and success[1][i]:
                    out.successes.append(bool(success[0][i]))
                counts[i] += 1
                if on_game is not None:
                    on_game(float(totals[i]))
        totals[done] = 0.0
        now = lives_in(info)
        lost = lost_life(lives, now, resetting) if life_loss else np.zeros(n, bool)
        push_frames(batch, frames, resetting | lost)
        resetting, lives = done, now
    return out


def _reported(info: dict[str, Any], key: str, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A vector env's ``info[key]`` for each env, and which envs reported it (its ``_key`` mask);
    None when no env did."""
    if key not in info:
        return None
    mask = np.asarray(info.get(f"_{key}", np.ones(n, bool)), bool)
    return np.asarray(info[key]).reshape(n), mask
