"""A small goal-conditioned env with a ``Dict`` observation space, as gymnasium-robotics' envs give
(``observation``, ``achieved_goal``, ``desired_goal``), plus entries of other dtypes and shapes so
that a store's packing of mixed dtypes is exercised: ``steps`` (int64) and ``seen`` (a uint8 image).

A point moves in the square [-1, 1]^2 by ``0.1 * action`` (a Box action in [-1, 1]^2, or one of four
directions with ``discrete=True``); the episode ends when it is within 0.1 of the goal, or after
``limit`` moves. Every next observation follows from the observation and the action alone
(``follows``), so a test can check any sampled transition without knowing where it came from.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

DIRECTIONS = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]], np.float32)


def goal_space() -> gym.spaces.Dict:
    point = gym.spaces.Box(-1, 1, (2,), np.float32)
    return gym.spaces.Dict({"observation": point, "achieved_goal": point, "desired_goal": point,
                            "steps": gym.spaces.Box(0, 10_000, (1,), np.int64),
                            "seen": gym.spaces.Box(0, 255, (3, 3), np.uint8)})


class Reach(gym.Env):
    def __init__(self, discrete: bool = False, limit: int = 30) -> None:
        self.observation_space = goal_space()
        self.action_space = gym.spaces.Discrete(4) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
        self.discrete, self.limit = discrete, limit

    def _obs(self) -> dict:
        seen = np.zeros((3, 3), np.uint8)
        seen[1 + int(np.sign(self.goal[1] - self.pos[1])), 1 + int(np.sign(self.goal[0] - self.pos[0]))] = 255
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy(),
                "steps": np.array([self.t], np.int64), "seen": seen}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = move(self.pos, DIRECTIONS[int(action)] if self.discrete else np.asarray(action, np.float32))
        self.t += 1
        distance = float(np.linalg.norm(self.pos - self.goal))
        return self._obs(), -distance, distance < 0.1, self.t >= self.limit, {}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        """The reward of reaching ``achieved_goal`` when aiming at ``desired_goal`` (vectorised)."""
        return reach_reward(achieved_goal, desired_goal, info)


def reach_reward(achieved_goal, desired_goal, info) -> np.ndarray:
    return -np.linalg.norm(np.asarray(achieved_goal, np.float32) - np.asarray(desired_goal, np.float32), axis=-1)


def move(pos: np.ndarray, action: np.ndarray) -> np.ndarray:
    return np.clip(pos + np.float32(0.1) * action, -1, 1).astype(np.float32)


def follows(obs: dict, action: np.ndarray, next_obs: dict, i: int, *, discrete: bool = False) -> bool:
    """Whether row ``i``'s ``next_obs`` is the step after ``obs`` with ``action`` (entries ``(n, ...)``)."""
    a = DIRECTIONS[int(action[i])] if discrete else np.asarray(action[i], np.float32)
    return (np.allclose(next_obs["observation"][i], move(obs["observation"][i], a))
            and np.array_equal(next_obs["desired_goal"][i], obs["desired_goal"][i])
            and np.array_equal(next_obs["achieved_goal"][i], next_obs["observation"][i])
            and int(next_obs["steps"][i][0]) == int(obs["steps"][i][0]) + 1)


class BitFlip(gym.Env):
    """Flip one of ``n`` bits a move to reach a goal pattern (HER's own test task, with Box entries):
    the reward is 0 on the goal and -1 elsewhere, so without relabelling a random policy almost never
    sees a reward to learn from. ``compute_reward`` is vectorised, as goal envs give it."""

    def __init__(self, n: int = 8, limit: int | None = None) -> None:
        bits = gym.spaces.Box(0, 1, (n,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = gym.spaces.Discrete(n)
        self.n, self.limit = n, limit or n

    def _obs(self) -> dict:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n).astype(np.float32)
        self.goal = self.np_random.integers(0, 2, self.n).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.state[int(action)] = 1 - self.state[int(action)]
        self.t += 1
        reward = float(self.compute_reward(self.state, self.goal, {}))
        return self._obs(), reward, reward == 0.0, self.t >= self.limit, {"is_success": reward == 0.0}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        return -(np.abs(np.asarray(achieved_goal) - np.asarray(desired_goal)).sum(axis=-1) > 0).astype(np.float32)


class Rooms(gym.Env):
    """A Dict observation with entries that are not Boxes: ``room`` a ``Discrete(5, start=1)``, ``lights``
    a ``MultiBinary((2, 3))``, ``doors`` a ``MultiDiscrete([3, 2], start=[0, 1])``, beside a float32
    ``pos``. Action ``a`` < 6 toggles light ``a``; 6 moves to the next room (1..5, round); 7 nudges
    ``pos`` and turns the first door. Episodes end after ``limit`` moves."""

    def __init__(self, limit: int = 12) -> None:
        self.observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                                                  "room": gym.spaces.Discrete(5, start=1),
                                                  "lights": gym.spaces.MultiBinary([2, 3]),
                                                  "doors": gym.spaces.MultiDiscrete([3, 2], start=[0, 1])})
        self.action_space = gym.spaces.Discrete(8)
        self.limit = limit

    def _obs(self) -> dict:
        return {"pos": self.pos.copy(), "room": self.room, "lights": self.lights.copy(), "doors": self.doors.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.room = int(self.np_random.integers(1, 6))
        self.lights = self.np_random.integers(0, 2, (2, 3)).astype(np.int8)
        self.doors = np.array([self.np_random.integers(0, 3), self.np_random.integers(1, 3)], np.int64)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a = int(action)
        if a < 6:
            self.lights[a // 3, a % 3] ^= 1
        elif a == 6:
            self.room = self.room % 5 + 1
        else:
            self.pos = move(self.pos, np.ones(2, np.float32))
            self.doors[0] = (self.doors[0] + 1) % 3
        self.t += 1
        return self._obs(), float(self.lights.sum()), False, self.t >= self.limit, {}


class NestedBitFlip(BitFlip):
    """``BitFlip`` with its goals nested one level down (``achieved_goal: {bits: ...}``, as Minari's
    kitchen datasets nest theirs), for relabelling a nested goal leaf for leaf."""

    def __init__(self, n: int = 8) -> None:
        super().__init__(n)
        bits = self.observation_space["observation"]
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": gym.spaces.Dict({"bits": bits}),
                                                  "desired_goal": gym.spaces.Dict({"bits": bits})})

    def _obs(self) -> dict:
        return {"observation": self.state.copy(), "achieved_goal": {"bits": self.state.copy()},
                "desired_goal": {"bits": self.goal.copy()}}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        unwrap = lambda goal: goal["bits"] if isinstance(goal, dict) else goal  # noqa: E731
        return super().compute_reward(unwrap(achieved_goal), unwrap(desired_goal), info)


# ``replaystore-train --env-id goal_env:BitFlip-v0`` (tests/ on PYTHONPATH): gymnasium imports this
# module, which registers it
gym.register("BitFlip-v0", entry_point=BitFlip, kwargs={"n": 8})
