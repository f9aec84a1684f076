"""An env wrapper whose infos report what a test chooses, as a function of the episode's moves so far."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym


class Reporting(gym.Wrapper):
    """``env`` whose info after move ``t`` of an episode (1, 2, ...) holds ``report(t)`` beside its
    own; with ``at_reset`` its reset's info holds ``report(0)`` too (Minari records one per step)."""

    def __init__(self, env: gym.Env, report: Callable[[int], dict[str, Any]], *, at_reset: bool = False) -> None:
        super().__init__(env)
        self.report, self.at_reset, self.t = report, at_reset, 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        return obs, {**info, **self.report(0)} if self.at_reset else info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, {**info, **self.report(self.t)}
