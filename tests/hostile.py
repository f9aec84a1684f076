"""Shared by the hostile-input tests (test_hostile_paths.py, test_hostile_input.py): a small filled
store beside a sentinel file outside it, whose bytes and mtime must never change."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from conftest import fill, make_store

from replaystore import ReplayStore


class Sentinel:
    """A file outside the store whose bytes and mtime must not change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"precious bytes the store must never touch\n" * 4)
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        self.before = (path.read_bytes(), path.stat().st_mtime_ns)

    def unchanged(self) -> bool:
        return (self.path.read_bytes(), self.path.stat().st_mtime_ns) == self.before


def filled_store(tmp_path: Path) -> Path:
    """A store of 40 transitions at ``tmp_path/store/replay.zarr`` (its test's ``filled`` fixture)."""
    path = tmp_path / "store" / "replay.zarr"
    path.parent.mkdir()
    store = make_store(path)
    fill(store, 40)
    store.close()
    return path


def holds_everything(path: Path) -> None:
    """Every committed transition still readable (the fill wrote 40)."""
    with ReplayStore.open(path) as store:
        assert len(store) == 40
        store.sample(8, rng=np.random.default_rng(0))


