"""The test frames, in a module of their own: child processes (crash_child.py) import them without
conftest.py, whose torch import (for the order of LLVM loads beside TensorFlow) costs ~3 s a process."""

from __future__ import annotations

import numpy as np

OBS_SHAPE = (3, 4)


def frame(position: int, shape: tuple[int, ...] = OBS_SHAPE) -> np.ndarray:
    """A frame whose bytes identify its step (and differ from every other step's)."""
    rng = np.random.default_rng(position)
    out = rng.integers(0, 256, size=shape, dtype=np.uint8)
    out.flat[0] = position % 251
    return out
