"""Atomic checkpoints: one ``checkpoint.npz`` per run, replaced whole.

It holds the online and target weights, the optimizer's variables (Adam's moments and iteration
count) and a JSON ``state`` (global step, epsilon, episode counters, RNG states). It is written to a
temporary file, fsynced, then renamed over the old one, so a crash at any moment leaves either the
previous checkpoint or the new one, never a torn file. The replay store is not in it: the store on
disk is the replay half of the checkpoint, flushed just before each one is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from trainer.args import TrainerError

CHECKPOINT = "checkpoint.npz"
PARTS = ("online", "target", "optimizer")


def save(run_dir: Path, arrays: dict[str, list[np.ndarray]], state: dict[str, Any]) -> Path:
    """Write ``arrays`` (``Agent.state()``) and ``state`` atomically to ``run_dir/checkpoint.npz``."""
    payload = {f"{part}/{i:04d}": np.asarray(a) for part in PARTS for i, a in enumerate(arrays[part])}
    payload["state"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
    path = run_dir / CHECKPOINT
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz.tmp", dir=run_dir)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load(run_dir: Path) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]] | None:
    """The arrays and state of the run's checkpoint, or None if the run stopped before its first one
    (it is written as soon as the networks exist); TrainerError if it is unreadable."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays: dict[str, list[np.ndarray]] = {part: [] for part in PARTS}
            for key in sorted(k for k in data.files if k != "state"):
                part, _ = key.split("/")
                arrays[part].append(data[key])
            state = json.loads(data["state"].tobytes().decode())
    except (OSError, ValueError, KeyError) as exc:
        raise TrainerError(f"cannot resume: {path} is unreadable ({exc})") from exc
    return arrays, state


def remove_partials(run_dir: Path) -> None:
    """Delete temporary files left by a crash while a checkpoint was being written."""
    for tmp in run_dir.glob(".checkpoint-*.npz.tmp"):
        tmp.unlink(missing_ok=True)
