"""Stores out as Minari datasets (``minari_from_store``): which episodes are written, and what an
export refuses or leaves behind (nothing, also when it is killed mid-write or the disk is full)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")

from minari_data import VECTOR, episode, written  # noqa: E402

from replaystore import ReplayStore  # noqa: E402
from replaystore.errors import ConfigError, StoreExistsError, StoreWriteError  # noqa: E402
from replaystore.integrations.minari import minari_from_store, store_from_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_root")  # Minari's datasets root: each test's own


def test_export_takes_whole_episodes_of_every_stream(tmp_path: Path) -> None:
    path = tmp_path / "streams.zarr"
    with ReplayStore.create(path, 24, VECTOR, gym.spaces.Discrete(3), num_streams=2) as store:
        # rings of 12 steps. Stream 0: episodes of 4 moves (5 steps): the first is cut at its start.
        # Stream 1: episodes of 2 moves (3 steps), the last still in progress.
        for s in range(12):
            e0, t0, e1, t1 = s // 4, s % 4, s // 2, s % 2
            obs = np.array([[100 * e0 + t0] * 3, [1000 + 100 * e1 + t1] * 3], np.float32)
            store.add_batch(obs, [t0 % 3, t1], [1.0, -1.0], obs + 1, [t0 == 3, t1 == 1 and s < 11], [False, False],
                            autoreset_mode="disabled")
    out = minari_from_store(path, "streams/back-v0")
    assert (out.episodes, out.moves, out.partial, out.in_progress) == (5, 14, 1, 1)
    back = [ep.observations[:, 0] for ep in minari.load_dataset("streams/back-v0").iterate_episodes()]
    starts = [100, 200, 1200, 1300, 1400]  # stream 0's whole episodes, then stream 1's, oldest first
    assert [b.tolist() for b in back] == [list(range(a, a + (5 if a < 1000 else 3))) for a in starts]


def test_export_refuses_what_it_cannot_write_and_leaves_no_dataset(tmp_path: Path, datasets_root: Path) -> None:
    written("fine/data-v0", [episode(3), episode(4, start=9.0)], VECTOR, gym.spaces.Discrete(3))
    store_from_minari("fine/data-v0", tmp_path / "s.zarr")
    before = sorted(str(p) for p in datasets_root.rglob("*"))
    with pytest.raises(StoreExistsError, match="fine/data-v0 already exists"):
        minari_from_store(tmp_path / "s.zarr", "fine/data-v0")
    with pytest.raises(ConfigError, match="namespace/.*name-vN"):
        minari_from_store(tmp_path / "s.zarr", "no version here")
    with pytest.raises(ConfigError, match="env is 'NoSuchEnv-v9'"):
        minari_from_store(tmp_path / "s.zarr", "xx/yy-v0", env="NoSuchEnv-v9")
    assert sorted(str(p) for p in datasets_root.rglob("*")) == before
    empty = tmp_path / "empty.zarr"
    with ReplayStore.create(empty, 16, VECTOR, gym.spaces.Discrete(3)) as store:
        store.add(np.zeros(3, np.float32), 1, 0.0, np.ones(3, np.float32), False, False)  # in progress only
    with pytest.raises(ConfigError, match="no whole episode .*1 in progress"):
        minari_from_store(empty, "xx/yy-v0")
    assert sorted(str(p) for p in datasets_root.rglob("*")) == before


KILLED_EXPORT = """
import os, signal, sys
from replaystore.integrations.minari import minari_from_store
minari_from_store(sys.argv[1], "killed/mid-v0", progress=lambda done, total: done == 2 and os.kill(os.getpid(), signal.SIGKILL))
"""


def test_what_a_killed_export_left_is_removed_by_the_next_one_on_this_machine(tmp_path: Path,
                                                                             datasets_root: Path) -> None:
    written("fine/many-v0", [episode(3 + i, start=10.0 * i) for i in range(6)], VECTOR, gym.spaces.Discrete(3))
    store_from_minari("fine/many-v0", tmp_path / "s.zarr")
    killed = subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(tmp_path / "s.zarr")], capture_output=True,
                            env={**os.environ, "MINARI_DATASETS_PATH": str(datasets_root)}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    left = [p for p in datasets_root.iterdir() if p.name.startswith(".replaystore-export-")]
    assert len(left) == 1 and any(p.is_file() for p in left[0].rglob("*")), left  # half written, under a hidden name
    assert not (datasets_root / "killed").exists()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        alive = datasets_root / f".replaystore-export-{host}-{sleeper.pid}"  # an export under way beside this one
        elsewhere = datasets_root / f".replaystore-export-other-host-{left[0].name.rpartition('-')[2]}"
        for folder in (alive, elsewhere):
            folder.mkdir()
        export = minari_from_store(tmp_path / "s.zarr", "killed/mid-v0")
        assert export.episodes == 6 and len(minari.load_dataset("killed/mid-v0")) == 6
        hidden = sorted(p.name for p in datasets_root.iterdir() if p.name.startswith("."))
        assert hidden == sorted([alive.name, elsewhere.name])  # the dead process's folder is gone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_export_the_disk_cannot_hold_is_refused_before_writing(tmp_path: Path, tiny_disk: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    frames = np.random.default_rng(1).integers(0, 255, (300, 96, 96), dtype=np.uint8)  # 1.9 MB exported, > the disk
    path = tmp_path / "big.zarr"
    with ReplayStore.create(path, 400, gym.spaces.Box(0, 255, (96, 96), np.uint8), gym.spaces.Discrete(2)) as store:
        for t in range(299):
            store.add(frames[t], t % 2, 1.0, frames[t + 1], t % 100 == 99, False)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tiny_disk))
    with pytest.raises(StoreWriteError, match=r"about 2\.9 MB .* 1\.0 MB free; nothing was written") as err:
        minari_from_store(path, "full/disk-v0")  # (HDF5 can crash the process on a disk that fills mid-write)
    assert err.value.errno == errno.ENOSPC
    assert os.listdir(tiny_disk) == []
