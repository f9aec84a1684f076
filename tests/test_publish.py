"""A destination that appears while a command runs is never replaced: ``merge`` (and ``compact SRC
NEWDST``, ``import-minari``) build beside DST and publish with ``renameat2(RENAME_NOREPLACE)``; a
store that a second process creates at DST mid-command keeps every committed step, and the command
fails with one line. (It used to swap the two and delete the other store.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot

from replaystore import Layout, ReplayStore, StoreExistsError
from replaystore.cli import main as cli_main

CREATOR = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import gymnasium as gym, numpy as np
    import zarr  # (what create imports on first use, ~0.5 s: before the race, not in it)
    from replaystore import ReplayStore
    dst = Path(sys.argv[1])
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("." + dst.name) for p in dst.parent.iterdir()):  # the command's staging
        if time.monotonic() > deadline:
            sys.exit("the command never started building")
        time.sleep(0.0005)
    with ReplayStore.create(dst, 64, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4) as store:
        for t in range(30):
            store.add(np.full((84, 84), t, np.uint8), 1, 1.0, np.full((84, 84), t + 1, np.uint8), False, False)
    print("created", flush=True)
""")


def _big(path: Path, steps: int, seed: int) -> Path:
    """``steps`` moves of random 84x84 frames (they compress badly: a compaction takes a while)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 255, (steps + 1, 84, 84), dtype=np.uint8)
    with ReplayStore.create(path, max(steps + 64, 512), gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4,
                            layout=Layout(shard_len=512)) as store:
        for t in range(steps):
            store.add(frames[t], t % 4, 1.0, frames[t + 1], False, False)
    return path


@pytest.mark.parametrize("verb", ["merge", "compact"])
def test_a_store_created_at_dst_mid_command_is_kept_whole(tmp_path: Path, verb: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    a = _big(tmp_path / "a.zarr", 3000, 1)
    b = _big(tmp_path / "b.zarr", 3000, 2)
    dst = tmp_path / "dst.zarr"
    sources = snapshot(a), snapshot(b)
    creator = subprocess.Popen([sys.executable, "-c", CREATOR, str(dst)], stdout=subprocess.PIPE, text=True)
    assert creator.stdout is not None and creator.stdout.readline().strip() == "ready"
    argv = ["merge", str(a), str(b), str(dst), "--quiet"] if verb == "merge" else ["compact", str(a), str(dst), "--quiet"]
    code = cli_main(argv)
    out, _ = creator.communicate(timeout=120)
    assert creator.returncode == 0 and "created" in out
    err = capsys.readouterr().err
    assert code == 1 and "appeared while the command ran" in err and err.count("\n") == 1, err
    with ReplayStore.open(dst) as store:  # the other process's store, whole
        assert len(store) == 30
    assert (snapshot(a), snapshot(b)) == sources
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "b.zarr", "dst.zarr"]  # no staging left


def test_without_a_rival_the_new_dst_is_published(tmp_path: Path) -> None:
    from replaystore.cli.compact import compact_store

    a = _big(tmp_path / "a.zarr", 200, 1)
    assert cli_main(["compact", str(a), str(tmp_path / "c.zarr"), "--quiet"]) == 0
    with ReplayStore.open(tmp_path / "c.zarr") as store:
        assert store.added > 0
    with pytest.raises(StoreExistsError):
        compact_store(a, tmp_path / "c.zarr")
