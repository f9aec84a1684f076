"""A CartPole that dies after ``CRASH_AFTER`` steps, for the trainer tests: ``--env-id
crashing_env:CrashingCartPole-v0`` with ``tests/`` on ``PYTHONPATH``. It raises, or with
``CRASH_MODE=exit`` ends its whole process at once (as a SIGKILL or an out-of-memory kill would)."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym


class CrashingCartPole(gym.Wrapper):
    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0
        self.crash_after = int(os.environ.get("CRASH_AFTER", "500"))

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps > self.crash_after:
            if os.environ.get("CRASH_MODE") == "exit":
                os._exit(17)
            raise RuntimeError(f"the environment died at step {self.steps}")
        return self.env.step(action)


gym.register("CrashingCartPole-v0", entry_point=CrashingCartPole)
