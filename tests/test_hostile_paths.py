"""Hostile paths, built with real files: the store never writes, truncates or deletes outside its
own directory (or key prefix), whatever links it meets; every refusal a ``ReplayStoreError`` in one
line, and the store still holds every committed transition. Each test keeps a sentinel outside the
store and checks its bytes and mtime afterwards (hostile.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, snapshot
from hostile import Sentinel, filled_store, holds_everything

from replaystore import ReplayStore, StoreExistsError, UnsafePathError
from replaystore.cli import main as cli_main
from replaystore.cli.compact import compact_store


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    return filled_store(tmp_path)


def test_a_symlinked_writer_lock_is_refused_not_written_through(filled: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = Sentinel(tmp_path / "elsewhere" / "important.txt")
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(sentinel.path)
    before = snapshot(filled)
    with pytest.raises(UnsafePathError, match="writer.lock is a symbolic link .* remove the link"):
        ReplayStore.open(filled, mode="a")
    assert cli_main(["compact", str(filled), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and err.count("\n") == 1
    assert sentinel.unchanged() and snapshot(filled) == before
    lock.unlink()
    holds_everything(filled)


def test_a_dangling_symlink_lock_creates_nothing(filled: Path, tmp_path: Path) -> None:
    target = tmp_path / "created-by-the-store"
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(target)
    with pytest.raises(UnsafePathError):
        ReplayStore.open(filled, mode="a")
    assert not target.exists()


def test_a_lock_that_is_not_a_regular_file_is_refused(filled: Path) -> None:
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        ReplayStore.open(filled, mode="a")
    lock.unlink()
    holds_everything(filled)


def test_a_symlinked_directory_inside_the_store_is_refused_for_writing(filled: Path, tmp_path: Path) -> None:
    """An array's directory moved elsewhere and linked back: writing would put shards there."""
    inside = next(p for p in filled.iterdir() if p.is_dir())
    outside = tmp_path / "elsewhere" / inside.name
    outside.parent.mkdir()
    inside.rename(outside)
    inside.symlink_to(outside)
    sentinel = Sentinel(outside / "sentinel")
    files = snapshot(outside)
    with pytest.raises(UnsafePathError, match="symbolic link .* inside the store"):
        ReplayStore.open(filled, mode="a")
    assert cli_main(["compact", str(filled), "--quiet"]) == 1
    assert sentinel.unchanged() and snapshot(outside) == files
    with ReplayStore.open(filled) as store:  # reading follows it
        assert len(store) == 40


def test_a_store_whose_root_is_a_link_is_followed_and_the_link_kept(filled: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.zarr"
    link.symlink_to(filled)
    store = ReplayStore.open(link, mode="a")
    store.end_episode()
    fill(store, 10, start=40)
    store.close()
    kept = compact_store(link, capacity=32).transitions_after  # (whole episodes, oldest cut)
    assert 0 < kept <= 32
    assert link.is_symlink() and os.readlink(link) == str(filled)
    assert not [p for p in [*tmp_path.iterdir(), *filled.parent.iterdir()] if ".compact-" in p.name]
    with ReplayStore.open(filled) as store:
        assert store.capacity == 32 and len(store) == kept


@pytest.mark.parametrize("where", ["inside", "deep inside"])
def test_compact_refuses_a_destination_inside_its_source(filled: Path, capsys: pytest.CaptureFixture[str],
                                                         where: str) -> None:
    dst = filled / "compacted.zarr" if where == "inside" else filled / "a" / "b" / "c.zarr"
    before = snapshot(filled)
    with pytest.raises(UnsafePathError, match="is inside .* choose a DST outside"):
        compact_store(filled, dst)
    assert cli_main(["compact", str(filled), str(dst), "--quiet"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert snapshot(filled) == before and not dst.exists()
    holds_everything(filled)


def test_compact_refuses_a_destination_that_reaches_its_source_through_a_link(filled: Path, tmp_path: Path) -> None:
    link = tmp_path / "alias"
    link.symlink_to(filled)
    with pytest.raises(UnsafePathError):
        compact_store(filled, link / "new.zarr")
    with pytest.raises(StoreExistsError):  # the source itself, under another name
        compact_store(filled, link)
    holds_everything(filled)



def _without_dac(*argv: str) -> list[str]:
    """``argv`` run as root without the capabilities that override file permissions."""
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *argv]


def test_a_read_only_store_compacts_into_a_new_dst_and_is_refused_in_place(filled: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    (filled / "writer.lock").unlink(missing_ok=True)
    before = snapshot(filled)
    for p in [filled, *filled.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        run = [sys.executable, "-m", "replaystore.cli", "compact", str(filled)]
        done = subprocess.run(_without_dac(*run, str(tmp_path / "copy.zarr"), "--quiet"), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        done = subprocess.run(_without_dac(*run, "--quiet"), capture_output=True, text=True)
        assert done.returncode == 1 and "cannot compact" in done.stderr and "into a new DST" in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    finally:
        for p in [filled, *filled.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert snapshot(filled) == before
    with ReplayStore.open(tmp_path / "copy.zarr") as copy:
        assert len(copy) == 40


def test_compact_on_object_storage_refuses_a_destination_under_its_source_prefix(s3_url: str) -> None:
    """The same rule for key prefixes: under SRC/ is refused; a sibling whose name merely starts
    with SRC's is not inside it."""
    from replaystore.storage.objects.bucket import Bucket

    store = ReplayStore.create(s3_url, 64, *__import__("conftest").small_spaces(), 2)
    fill(store, 40)
    store.close()

    def objects() -> dict[str, str]:
        return {m["path"]: m["e_tag"] for m in Bucket(s3_url).list(None)}

    before = objects()
    with pytest.raises(UnsafePathError, match="is inside"):
        compact_store(s3_url, s3_url + "/inner.zarr")
    assert objects() == before
    assert compact_store(s3_url, s3_url + "2").transitions_after == 40  # replay.zarr2: beside it, not inside
    assert objects() == before




@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MB tmpfs: real ENOSPC."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "tiny"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _noisy_store(path: Path, steps: int) -> None:
    """Frames of noise (they do not compress): ~7 KB a step on disk."""
    import gymnasium as gym

    store = ReplayStore.create(path, 1024, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (84, 84), dtype=np.uint8)
    for i in range(steps):
        nxt = rng.integers(0, 256, (84, 84), dtype=np.uint8)
        store.add(obs, 0, 1.0, nxt, i % 50 == 49, False)
        obs = rng.integers(0, 256, (84, 84), dtype=np.uint8) if i % 50 == 49 else nxt
    store.close()


@pytest.mark.parametrize("where", ["new DST", "in place"])
def test_compact_on_a_full_disk_keeps_nothing_of_the_copy_and_the_source_whole(tmp_path: Path, tiny_disk: Path,
                                                                              capsys: pytest.CaptureFixture[str],
                                                                              where: str) -> None:
    src = tiny_disk / "src.zarr" if where == "in place" else tmp_path / "src.zarr"
    _noisy_store(src, 150 if where == "in place" else 600)  # in place: ~1.1 MB, and no room for a second copy
    before = snapshot(src)
    argv = ["compact", str(src)] + ([str(tiny_disk / "dst.zarr")] if where == "new DST" else []) + ["--quiet"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert "disk full while writing the compacted copy" in err and "is unchanged" in err and err.count("\n") == 1
    assert "flush()" not in err
    assert snapshot(src) == before
    assert [p.name for p in tiny_disk.iterdir()] == (["src.zarr"] if where == "in place" else [])
    with ReplayStore.open(src) as store:
        assert len(store) == (150 if where == "in place" else 600)
