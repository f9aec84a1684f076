"""Dopamine's replay checkpoints written as its ``OutOfGraphReplayBuffer`` writes them, and what that
buffer samples from one, for tests/test_dopamine.py. Written from Dopamine's documented behaviour
(circular_replay_buffer.py: ``add`` pads each episode's start with ``stack - 1`` zero rows, ``save``
writes each member as a gzip'd ``np.save``, ``sample_transition_batch`` builds stacks with
wraparound and n-step returns as ``discounts[:m].dot(rewards)``), not imported from it."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np


class DopamineBuffer:
    """A ring of ``capacity`` rows as Dopamine's buffer keeps it, and its ``save``."""

    def __init__(self, capacity: int, stack: int, horizon: int = 1, shape: tuple[int, ...] = (6, 5),
                 gamma: float = 0.99) -> None:
        self.capacity, self.stack, self.horizon, self.gamma = capacity, stack, horizon, gamma
        # Dopamine makes its ring with np.empty: the rows not yet written hold whatever was there
        self.observation = np.full((capacity, *shape), 77, np.uint8)
        self.action = np.full(capacity, 9, np.int32)
        self.reward = np.full(capacity, np.nan, np.float32)
        self.terminal = np.full(capacity, 205, np.uint8)
        self.add_count = np.array(0)
        self.invalid_range = np.zeros(stack)

    def cursor(self) -> int:
        return int(self.add_count) % self.capacity

    def add(self, obs: np.ndarray, action: int, reward: float, terminal: bool) -> None:
        if self.add_count == 0 or self.terminal[self.cursor() - 1] == 1:
            for _ in range(self.stack - 1):
                self._add(np.zeros_like(self.observation[0]), 0, 0.0, 0)
        self._add(obs, action, reward, int(terminal))

    def _add(self, obs: np.ndarray, action: int, reward: float, terminal: int) -> None:
        c = self.cursor()
        self.observation[c], self.action[c], self.reward[c], self.terminal[c] = obs, action, reward, terminal
        self.add_count += 1
        c = self.cursor()
        self.invalid_range = np.array([(c - self.horizon + i) % self.capacity
                                       for i in range(self.stack + self.horizon)])

    def save(self, folder: Path, number: int, *, level: int = 9) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        members = {"$store$_observation": self.observation, "$store$_action": self.action,
                   "$store$_reward": self.reward, "$store$_terminal": self.terminal, "add_count": self.add_count,
                   "invalid_range": self.invalid_range}
        for name, array in members.items():
            with (open(folder / f"{name}_ckpt.{number}.gz", "wb") as f,
                  gzip.GzipFile(fileobj=f, mode="wb", compresslevel=level) as out):
                np.save(out, array, allow_pickle=False)

    # ---- what the buffer samples ----------------------------------------------------------------

    def valid_indices(self) -> list[int]:
        """Every index ``sample_index_batch`` can return (the range it draws from, filtered by
        ``is_valid_transition``)."""
        cap, k, n, cursor = self.capacity, self.stack, self.horizon, self.cursor()
        if self.add_count >= cap:
            lo, hi = cursor - cap + k - 1, cursor - n
        else:
            lo, hi = k - 1, cursor - n
        out = []
        for raw in range(lo, hi):
            index = raw % cap
            if self.add_count < cap and (index >= cursor - n or index < k - 1):
                continue
            if index in set(int(i) for i in self.invalid_range):
                continue
            if self.terminal[[(index - k + 1 + j) % cap for j in range(k - 1)]].any():
                continue
            out.append(index)
        return out

    def transition(self, index: int) -> tuple[bytes, int, np.float32, bytes, bool, int]:
        """(state, action, n-step reward, next state, terminal, add number of the row) at ``index``."""
        cap, k, n = self.capacity, self.stack, self.horizon
        window = [(index + j) % cap for j in range(n)]
        terminals = self.terminal[window]
        length = int(np.argmax(terminals.astype(bool))) + 1 if terminals.any() else n
        discounts = np.array([math.pow(self.gamma, j) for j in range(n)], dtype=np.float32)
        rewards = self.reward[[(index + j) % cap for j in range(length)]]
        reward = discounts[:length].dot(rewards)

        def stack(i: int) -> bytes:
            return self.observation[[(i - k + 1 + j) % cap for j in range(k)]].tobytes()

        added = int(self.add_count)
        row = added - ((self.cursor() - index) % cap or cap)
        return (stack(index), int(self.action[index]), reward, stack((index + length) % cap), bool(terminals.any()),
                row)


def play(buffer: DopamineBuffer, rng: np.random.Generator, adds: int, *, mean_length: int = 9,
         start: int = 0) -> int:
    """Add ``adds`` rows' worth of random episodes (frames that are never all zero), returning the
    next frame counter."""
    t = start
    begun = int(buffer.add_count)
    while int(buffer.add_count) - begun < adds:
        t += 1
        frame = rng.integers(1, 255, buffer.observation.shape[1:], dtype=np.uint8)
        frame.flat[0] = t % 251 + 1
        terminal = bool(rng.random() < 1 / mean_length)
        reward = float(rng.choice([0.0, 0.0, 1.0, -1.0, 4.0, 7.0, 0.3]))
        buffer.add(frame, int(rng.integers(0, 6)), reward, terminal)
    return t


def write_runs(root: str, runs: list[int], *, capacity: int = 300, every: int = 200, saves: int = 3,
               shape: tuple[int, ...] = (84, 84)) -> None:
    """Small runs laid out as the DQN Replay Dataset's (``root/<run>/replay_logs``), for the docs."""
    for run in runs:
        rng = np.random.default_rng(run)
        buffer = DopamineBuffer(capacity, 4, 1, shape)
        t = 0
        for number in range(saves):
            t = play(buffer, rng, every, start=t, mean_length=60)
            buffer.save(Path(root) / str(run) / "replay_logs", number)
