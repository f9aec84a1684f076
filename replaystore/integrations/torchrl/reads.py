"""Reading a replay store at given positions, for records.py: ``At``, a sampler that reads exactly
the transitions asked for (TorchRL's indices, mapped), and ``live_slots``, which refuses positions
the store has overwritten since they were indexed."""

from __future__ import annotations

import numpy as np

from replaystore.errors import SampleError
from replaystore.sampling.assemble import Batch, prepare
from replaystore.sampling.pending import Pending
from replaystore.sampling.samplers import UniformSampler
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import SHIFT, Rings


def live_slots(rings: Rings, at: np.ndarray) -> np.ndarray:
    """The slots of store positions ``at``; ``SampleError`` if the store has overwritten any."""
    slots = rings.slots(at)
    if rings.num_streams == 1:
        lo: np.ndarray | int = rings.streams[0].lo
    else:
        lo = np.array([ring.lo for ring in rings.streams], dtype=np.int64)[at >> SHIFT]
        at = at & ((1 << SHIFT) - 1)
    if not rings.valid[slots].all() or (at < lo).any():
        raise SampleError("a transition TorchRL still indexes was overwritten in the store (a stream filled "
                          "faster than the others); pass streams= the number of envs your collector steps")
    return slots


class At(UniformSampler):
    """The transitions at given store positions (TorchRL's indices mapped), read as a uniform batch."""

    def __init__(self, positions: np.ndarray) -> None:
        super().__init__()
        self.positions = positions

    def plan(self, rings: Rings, reader: FrameReader, batch_size: int, rng: np.random.Generator, *,
             batches: int = 1, out: list[np.ndarray] | None = None) -> Pending:
        at = self.positions
        live_slots(rings, at)
        return prepare(rings, reader, at, n_step=1, result=Batch)
