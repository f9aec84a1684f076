"""The actions an agent takes: a ``Discrete`` space's ``n`` moves (DQN, QR-DQN) or a bounded ``Box``
(continuous control: SAC), as one small value, ``ActionSpec``, that acting, evaluation, the model
checks and ``agent.json`` share. A ``Box`` is kept as its shape and its finite bounds; a policy acts
in [-1, 1] per dimension and ``scaled`` maps that onto the bounds (``unit`` maps a stored action
back), so the store keeps each action as the env took it."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import numpy as np

from .config import TrainerError

#: The most values one Box action may hold (the store's own limit: format/spaces.py).
MAX_ACTION_VALUES = 1024


@dataclasses.dataclass(frozen=True)
class ActionSpec:
    """A ``Discrete(n)`` space (``n`` > 0), or a ``Box`` of ``shape`` with bounds ``low`` and
    ``high`` (flattened, finite; ``n`` 0)."""

    n: int = 0
    shape: tuple[int, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    @classmethod
    def of_space(cls, space: Any) -> ActionSpec:
        """The spec of a gymnasium action space; TrainerError for a space no agent here acts in."""
        if hasattr(space, "n") and tuple(getattr(space, "shape", ()) or ()) == ():
            return cls(n=int(space.n))
        low, high = getattr(space, "low", None), getattr(space, "high", None)
        if low is None or high is None or not np.issubdtype(np.asarray(low).dtype, np.floating):
            raise TrainerError(f"actions of {space}; the agents here act in a Discrete space (DQN, QR-DQN) or a "
                               "float Box (SAC): wrap the env to one of those")
        shape = tuple(int(d) for d in space.shape)
        if not 0 < math.prod(shape) <= MAX_ACTION_VALUES:
            raise TrainerError(f"actions of {space}: a Box action holds 1 to {MAX_ACTION_VALUES:,} values")
        low_, high_ = np.asarray(low, np.float64).ravel(), np.asarray(high, np.float64).ravel()
        if not (np.isfinite(low_).all() and np.isfinite(high_).all() and (low_ < high_).all()):
            raise TrainerError(f"actions of {space}: a policy's actions are scaled onto the Box's bounds, which must be "
                               "finite with low < high; wrap the env with gymnasium.wrappers.RescaleAction")
        return cls(shape=shape, low=tuple(low_.tolist()), high=tuple(high_.tolist()))

    @classmethod
    def of(cls, actions: ActionSpec | int) -> ActionSpec:
        """``actions``, or ``Discrete(actions)`` for an int (the number of Q-values)."""
        if isinstance(actions, ActionSpec):
            return actions
        return cls(n=operator.index(actions))

    @property
    def discrete(self) -> bool:
        return self.n > 0

    @property
    def size(self) -> int:
        """Values per action: 1 for a Discrete (one int), the Box's size."""
        return 1 if self.discrete else math.prod(self.shape)

    def matches(self, space: Any) -> bool:
        """Whether an env acting in ``space`` takes these actions."""
        try:
            return ActionSpec.of_space(space) == self
        except TrainerError:
            return False

    def describe(self) -> str:
        if self.discrete:
            return f"{self.n} actions"
        return f"Box actions of shape {self.shape} in [{min(self.low):g}, {max(self.high):g}]"

    def random(self, n: int | None, rng: np.random.Generator) -> np.ndarray:
        """Uniform random actions: one (``n`` None, as an array of one) or ``n``."""
        if self.discrete:
            return np.array([int(rng.integers(self.n))]) if n is None else rng.integers(self.n, size=n)
        count = 1 if n is None else n
        values = rng.uniform(np.asarray(self.low), np.asarray(self.high), size=(count, self.size))
        return values.astype(np.float32).reshape(count, *self.shape)

    def scaled(self, unit: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] ``(n, size)`` as the env's: ``(n, *shape)`` float32 on the Box's bounds."""
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        out = low + (np.clip(unit, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
        return out.astype(np.float32).reshape(len(unit), *self.shape)

    def unit(self, actions: Any) -> Any:
        """The env's Box actions ``(batch, *shape)`` as ``(batch, size)`` in [-1, 1] (``keras.ops``)."""
        from keras import ops

        low = ops.convert_to_tensor(np.asarray(self.low, np.float32))
        high = ops.convert_to_tensor(np.asarray(self.high, np.float32))
        flat = ops.reshape(ops.cast(actions, "float32"), (-1, self.size))
        return ops.clip(2.0 * (flat - low) / (high - low) - 1.0, -1.0, 1.0)

    def one(self, actions: np.ndarray) -> Any:
        """The first of a batch of actions, as one env's ``step`` takes it (an int for a Discrete)."""
        return int(actions[0]) if self.discrete else np.asarray(actions[0])

    def to_json(self) -> Any:
        """``agent.json``'s ``actions``: the number of actions (a Discrete), or the Box's shape and bounds."""
        if self.discrete:
            return self.n
        return {"shape": list(self.shape), "low": list(self.low), "high": list(self.high)}

    @classmethod
    def from_json(cls, doc: Any) -> ActionSpec:
        """``to_json``'s document back (KeyError, TypeError or ValueError if it is damaged)."""
        if isinstance(doc, dict):
            shape = tuple(int(d) for d in doc["shape"])
            low, high = tuple(float(v) for v in doc["low"]), tuple(float(v) for v in doc["high"])
            if len(low) != math.prod(shape) or len(high) != len(low):
                raise ValueError("the Box's bounds do not match its shape")
            return cls(shape=shape, low=low, high=high)
        if isinstance(doc, bool) or not isinstance(doc, int) or doc < 1:
            raise ValueError(f"actions {doc!r}")
        return cls(n=doc)
