"""A planned batch: its scalars read, its frames planned, its frames not yet decoded (samplers.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.format.extras import group
from replaystore.storage.plan import Plan
from replaystore.storage.reader import FrameReader

#: A field of a batch: its shape (the batch first) and dtype.
FieldSpec = tuple[tuple[int, ...], np.dtype]


@dataclass(frozen=True)
class Pending:
    """A batch (or ``batches`` of them) whose scalars are read and whose frames are planned but not
    yet decoded. ``fields`` holds every field but the frames, the batches' rows one after another;
    ``out`` the frame arrays given to ``plan`` (or None: ``finish`` makes them)."""

    fields: dict[str, np.ndarray]
    plans: list[Plan]  # one per batch
    frames: tuple[str, ...]  # the frame fields, in the order of each plan's rows
    out: list[np.ndarray] | None
    result: Callable[..., Any]  # the fields (frames included) as keywords -> the batch
    #: run on the decoded frames and the fields before the batch is made (hindsight relabelling);
    #: frame fields named ``_...`` are its own and not part of the batch
    complete: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None] | None = None

    def finish(self, reader: FrameReader) -> Any:
        """Decode the frames (no lock needed) and return the batch. Given an ``out``, the frame
        fields are the ``out`` arrays (every batch), the others ``(batches * batch_size, ...)``."""
        reader.fetch(self.plans)  # chunks missing from the cache, read for all the batches at once
        done = [reader.finish(plan) for plan in self.plans]
        if self.out is None:
            frames = {name: done[0][i] for i, name in enumerate(self.frames)}
        else:
            frames = dict(zip(self.frames, self.out))
        if self.complete is not None:
            self.complete(frames, self.fields)
        return self.result(**{k: v for k, v in frames.items() if not k.startswith("_")}, **group(self.fields))
