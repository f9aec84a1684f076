"""Dopamine runs into a new store: ``store_from_dopamine`` (see the package's docstring)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, CorruptStoreError, StoreExistsError
from replaystore.integrations.dopamine.plan import RunPlan, plan_run
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend
from replaystore.store import ReplayStore

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RunImport:
    """What one run became: stream ``stream`` of the store."""

    folder: str
    stream: int
    checkpoints: int
    rows: int  # rows of the run taken from its checkpoints (each once)
    shared: int  # rows that two checkpoints both held, stored once
    gaps: int  # places where the buffer overwrote rows between two saves
    rows_lost: int  # rows in those gaps
    steps: int
    horizon: int  # the update horizon the run's buffer was saved with


@dataclass(frozen=True)
class DopamineImport:
    """What ``store_from_dopamine`` wrote."""

    path: str
    runs: tuple[RunImport, ...]
    frame_stack: int
    frame_shape: tuple[int, ...]
    actions: int
    bytes_on_disk: int


def store_from_dopamine(runs: Sequence[str | Path], path: str | Path, *, layout: Any = None,
                        storage_options: dict[str, Any] | None = None,
                        progress: Progress | None = None) -> DopamineImport:
    """Make a new store at ``path`` holding every checkpoint of each Dopamine run in ``runs`` (a
    folder of replay checkpoints, or a run folder with them in ``replay_logs``), run ``i`` as stream
    ``i``, and return what was written. ``layout`` and ``storage_options`` are as for
    ``ReplayStore.create``; ``progress(done, total)`` is called with the rows read so far.
    """
    if isinstance(runs, (str, Path)) or not runs:
        raise ConfigError("runs is a list of Dopamine run folders (one stream each); pass at least one")
    target = open_backend(path, storage_options)
    if target.exists():
        raise StoreExistsError(f"{target.where} already exists; import-dopamine makes a new store: choose a new path, "
                               "or delete what is there")
    sizes = []  # a first pass over the scalars only: each run's steps, so the rings fit the longest
    for folder in runs:
        plan = plan_run(folder)
        sizes.append((plan.steps, plan.rows, plan.stack, plan.frame_shape, plan.frame_dtype, plan.max_action))
        del plan
    stack, shape, dtype = sizes[0][2:5]
    for folder, size in zip(runs, sizes, strict=True):
        if size[2:5] != (stack, shape, dtype):
            raise ConfigError(f"{folder} holds stacks of {size[2]} frames of {size[3]} {size[4]}; {runs[0]} holds "
                              f"stacks of {stack} of {shape} {dtype}: one store holds runs of one game and agent")
    per_stream = max(max(s[0] for s in sizes), 2)
    total_rows = sum(s[1] for s in sizes)
    actions = max(s[5] for s in sizes) + 1
    import gymnasium as gym

    space = gym.spaces.Box(*_bounds(dtype), shape, dtype)
    staged = target.staging()
    if staged.exists():
        staged.destroy()  # this process's own leftover
    done: list[RunImport] = []
    try:
        store = ReplayStore.create(staged.where, per_stream * len(runs), space, gym.spaces.Discrete(actions), stack,
                                   layout=layout, cache_bytes=0, num_streams=len(runs), frame_padding="zero",
                                   storage_options=storage_options)
        with store:
            read = [0]
            for k, folder in enumerate(runs):
                plan = plan_run(folder)
                store.load_steps(plan.scalars, _frames(plan, read, total_rows, progress), stream=k)
                done.append(RunImport(folder=str(plan.folder), stream=k, checkpoints=plan.checkpoints, rows=plan.rows,
                                      shared=plan.shared, gaps=len(plan.gaps),
                                      rows_lost=sum(b - a for a, b in plan.gaps), steps=plan.steps,
                                      horizon=plan.horizon))
                del plan
            store.flush()
            stored = sum(store.backend.stored_bytes().values())
    except BaseException:
        _discard(staged)
        raise
    target.publish(staged, replace=False)  # (never over a store made at the path meanwhile)
    return DopamineImport(path=target.where, runs=tuple(done), frame_stack=stack, frame_shape=shape, actions=actions,
                          bytes_on_disk=stored)


def _frames(plan: RunPlan, read: list[int], total: int, progress: Progress | None) -> Iterator[np.ndarray]:
    """The run's step frames, a block at a time: kept rows' observations, a zero frame after each
    terminal row; the pad rows left out are checked to be zeros."""
    i = 0
    for seg in plan.segments:
        start = i
        for block in seg.checkpoint.frames(seg.first, seg.stop):
            n = len(block)
            keep, pad, zero_after = plan.keep[i:i + n], plan.pad[i:i + n], plan.zero_after[i:i + n]
            if pad.any() and block[pad].any():
                row = seg.first + (i - start) + int(np.flatnonzero(pad)[0])
                raise CorruptStoreError(f"row {row:,} of {seg.checkpoint} should be one of the zero frames Dopamine "
                                        "writes before an episode's first, and is not: these are not Dopamine's DQN "
                                        "replay checkpoints")
            rows = np.flatnonzero(keep)
            twice = zero_after[rows]
            if not twice.any():
                kept = block if rows.size == n else block[rows]
            else:  # one gather of the frames: each terminal row's twice, its copy zeroed
                reps = 1 + twice.astype(np.int64)
                kept = block[np.repeat(rows, reps)]
                kept[np.cumsum(reps)[twice] - 1] = 0  # the zero frame after a terminal row
            i += n
            read[0] += n
            if progress is not None:
                progress(read[0], total)
            yield kept


def _bounds(dtype: np.dtype) -> tuple[float, float]:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min, info.max
    if dtype.kind == "b":
        return 0, 1
    return -np.inf, np.inf


def _discard(staged: Backend) -> None:
    """Remove an unfinished store."""
    try:
        staged.destroy()
    except Exception as exc:  # noqa: BLE001 - the first error is the one to report
        print(f"warning: could not remove the unfinished store at {staged.where} ({exc}); delete it", file=sys.stderr)
